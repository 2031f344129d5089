# GPU nodes: their security group and the launch template they boot from (IMDSv2 required,
# encrypted root volume, the node instance profile, spotplane-agent started from user data).

resource "aws_security_group" "node" {
  name        = "${var.name}-node"
  description = "spotplane ${var.name}: GPU nodes. No inbound; outbound HTTPS to the control plane, S3 and registries."
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.name}-node" })
}

resource "aws_vpc_security_group_egress_rule" "node_https" {
  security_group_id = aws_security_group.node.id
  description       = "HTTPS: the control plane, S3 checkpoints, container registries"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
  tags              = local.tags
}

resource "aws_launch_template" "node" {
  name                   = "${var.name}-gpu-node"
  description            = "spotplane ${var.name} GPU node: IMDSv2 only, encrypted root volume, spotplane-agent from user data"
  image_id               = var.image_id
  update_default_version = true
  vpc_security_group_ids = [aws_security_group.node.id]
  user_data              = base64encode(local.node_boot_script)
  tags                   = local.tags

  iam_instance_profile {
    name = aws_iam_instance_profile.node.name
  }

  # The agent speaks IMDSv2 (a token first); one hop keeps the node's credentials away from
  # containers the jobs run in.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  block_device_mappings {
    device_name = var.node_root_device_name

    ebs {
      volume_size           = var.node_root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags          = local.tags
  }

  tag_specifications {
    resource_type = "volume"
    tags          = local.tags
  }
}
