# One customer-managed key for the cluster's data at rest: the checkpoint bucket, the database,
# its Performance Insights, the secrets and the logs. (The queue uses SQS-managed encryption:
# EventBridge writes to it without any key policy, and its messages hold only instance ids.)

resource "aws_kms_key" "this" {
  description             = "spotplane ${var.name}: checkpoints, database, secrets, logs"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json
  tags                    = local.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/spotplane-${var.name}"
  target_key_id = aws_kms_key.this.key_id
}

data "aws_iam_policy_document" "kms" {
  #checkov:skip=CKV_AWS_109:A key policy's Resource "*" means this key; the account statement is AWS's default key policy, which lets IAM policies (the roles below) grant use of the key.
  #checkov:skip=CKV_AWS_111:A key policy's Resource "*" means this key; the account statement is AWS's default key policy, which lets IAM policies (the roles below) grant use of the key.
  #checkov:skip=CKV_AWS_356:A key policy's Resource "*" means this key, not every resource.
  statement {
    sid       = "AccountAdministersTheKeyThroughIam"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account}:root"]
    }
  }

  statement {
    sid       = "CloudWatchLogsEncryptsThisAccountsLogGroups"
    actions   = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["logs.${local.region}.amazonaws.com"]
    }

    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.partition}:logs:${local.region}:${local.account}:log-group:*"]
    }
  }
}
