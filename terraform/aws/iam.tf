# IAM: the control plane may make exactly the calls providers/src/aws.rs makes, on this
# cluster's resources; the nodes may reach their checkpoint prefix and nothing else.

locals {
  ec2_arn        = "arn:${local.partition}:ec2:${local.region}:${local.account}"
  node_role_name = "${var.name}-node"
}

# --- The control plane's task role -------------------------------------------------------------

resource "aws_iam_role" "control_plane" {
  name               = "${var.name}-control-plane"
  description        = "spotplane control plane (${var.name}): EC2 for nodes, the interruption queue, the checkpoint bucket"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:${local.partition}:ecs:${local.region}:${local.account}:*"]
    }
  }
}

resource "aws_iam_role_policy" "control_plane" {
  name   = "spotplane-control-plane"
  role   = aws_iam_role.control_plane.id
  policy = data.aws_iam_policy_document.control_plane.json
}

data "aws_iam_policy_document" "control_plane" {
  #checkov:skip=CKV_AWS_356:The four EC2 Describe calls and pricing:GetProducts support no resource-level permissions, so their Resource must be "*"; they are limited by region instead.
  #checkov:skip=CKV_AWS_111:Writes are limited by resource ARN and tag conditions; launch-time parts EC2 creates untagged (fleet, volume, network interface, spot request, launch template) cannot carry the tag condition, and are limited to this account and region.
  # Offers, zones, reconciliation: Describe calls, which take no resource ARNs.
  statement {
    sid = "Describe"
    actions = [
      "ec2:DescribeSpotPriceHistory",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeAvailabilityZones",
      "ec2:DescribeInstances",
    ]
    resources = ["*"]

    condition {
      test     = "StringEquals"
      variable = "aws:RequestedRegion"
      values   = local.regions
    }
  }

  # On-demand prices: the Price List Query API, read-only, one endpoint region.
  statement {
    sid       = "PriceList"
    actions   = ["pricing:GetProducts"]
    resources = ["*"]

    condition {
      test     = "StringEquals"
      variable = "aws:RequestedRegion"
      values   = [var.price_list_region]
    }
  }

  # The instance itself must be tagged spotplane-cluster = this cluster at launch.
  statement {
    sid       = "LaunchTaggedInstances"
    actions   = ["ec2:RunInstances", "ec2:CreateFleet"]
    resources = ["${local.ec2_arn}:instance/*"]

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.cluster_tag}"
      values   = [var.name]
    }
  }

  # What a launch uses: this cluster's AMI, node subnets and node security group only.
  statement {
    sid     = "LaunchFromThisClustersInputs"
    actions = ["ec2:RunInstances", "ec2:CreateFleet"]
    resources = concat(
      ["arn:${local.partition}:ec2:${local.region}::image/${var.image_id}"],
      ["arn:${local.partition}:ec2:${local.region}::snapshot/*"],
      [for s in values(var.node_subnets) : "${local.ec2_arn}:subnet/${s}"],
      ["${local.ec2_arn}:security-group/${aws_security_group.node.id}"],
    )
  }

  # Parts a launch creates that spotplane does not tag (providers/src/aws.rs tags the instance).
  statement {
    sid     = "LaunchParts"
    actions = ["ec2:RunInstances", "ec2:CreateFleet"]
    resources = [
      "${local.ec2_arn}:fleet/*",
      "${local.ec2_arn}:volume/*",
      "${local.ec2_arn}:network-interface/*",
      "${local.ec2_arn}:spot-instances-request/*",
      "${local.ec2_arn}:launch-template/*",
    ]
  }

  # CreateFleet launches from a template spotplane keeps per node template (spotplane-<hash>).
  statement {
    sid       = "LaunchTemplates"
    actions   = ["ec2:CreateLaunchTemplate"]
    resources = ["${local.ec2_arn}:launch-template/*"]
  }

  # Tags only as part of a launch, and only with this cluster's tag.
  statement {
    sid       = "TagOnLaunch"
    actions   = ["ec2:CreateTags"]
    resources = ["${local.ec2_arn}:instance/*"]

    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["RunInstances", "CreateFleet"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.cluster_tag}"
      values   = [var.name]
    }
  }

  # Terminate only this cluster's instances (the orphan sweeper included).
  statement {
    sid       = "TerminateThisClustersInstances"
    actions   = ["ec2:TerminateInstances"]
    resources = ["${local.ec2_arn}:instance/*"]

    condition {
      test     = "StringEquals"
      variable = "ec2:ResourceTag/${local.cluster_tag}"
      values   = [var.name]
    }
  }

  statement {
    sid       = "PassTheNodeRoleToEc2"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.node.arn]

    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ec2.amazonaws.com"]
    }
  }

  statement {
    sid       = "InterruptionQueue"
    actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage"]
    resources = [aws_sqs_queue.interruptions.arn]
  }

  statement {
    sid       = "CheckpointBucketList"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.checkpoints.arn]
  }

  statement {
    sid = "CheckpointObjects"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
      "s3:ListMultipartUploadParts",
    ]
    resources = ["${aws_s3_bucket.checkpoints.arn}/*"]
  }

  statement {
    sid       = "CheckpointKeyThroughS3"
    actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
    resources = [aws_kms_key.this.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${local.region}.amazonaws.com"]
    }
  }
}

# --- The task execution role: pulls the image, writes logs, reads the two secrets ---------------

resource "aws_iam_role" "execution" {
  name               = "${var.name}-control-plane-execution"
  description        = "ECS task execution for the spotplane control plane (${var.name})"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

resource "aws_iam_role_policy_attachment" "execution" {
  role       = aws_iam_role.execution.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

resource "aws_iam_role_policy" "execution_secrets" {
  name   = "spotplane-secrets"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution_secrets.json
}

data "aws_iam_policy_document" "execution_secrets" {
  statement {
    sid       = "ReadTheControlPlanesSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.database_url.arn, aws_secretsmanager_secret.bootstrap_admin_token.arn, aws_secretsmanager_secret.secrets_key.arn]
  }

  statement {
    sid       = "DecryptThemThroughSecretsManager"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.this.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${local.region}.amazonaws.com"]
    }
  }
}

# --- GPU nodes: their checkpoint prefix, nothing else ---------------------------------------------

resource "aws_iam_role" "node" {
  name               = local.node_role_name
  description        = "spotplane GPU nodes (${var.name}): read and write checkpoints under ${var.checkpoint_prefix}"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
  tags               = local.tags
}

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_instance_profile" "node" {
  name = local.node_role_name
  role = aws_iam_role.node.name
  tags = local.tags
}

resource "aws_iam_role_policy" "node" {
  name   = "spotplane-checkpoints"
  role   = aws_iam_role.node.id
  policy = data.aws_iam_policy_document.node.json
}

data "aws_iam_policy_document" "node" {
  statement {
    sid       = "ListTheCheckpointPrefix"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.checkpoints.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [var.checkpoint_prefix, "${var.checkpoint_prefix}*"]
    }
  }

  statement {
    sid = "CheckpointObjects"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
      "s3:ListMultipartUploadParts",
    ]
    resources = ["${aws_s3_bucket.checkpoints.arn}/${var.checkpoint_prefix}*"]
  }

  statement {
    sid       = "CheckpointKeyThroughS3"
    actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
    resources = [aws_kms_key.this.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${local.region}.amazonaws.com"]
    }
  }
}

# EC2 launches spot instances only once this service-linked role exists in the account.
resource "aws_iam_service_linked_role" "spot" {
  count            = var.create_spot_service_linked_role ? 1 : 0
  aws_service_name = "spot.amazonaws.com"
  description      = "Lets EC2 launch and manage spot instances (created for spotplane ${var.name})"
  tags             = local.tags
}
