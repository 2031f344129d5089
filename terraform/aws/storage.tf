# The checkpoint bucket (object_store.url) and the bucket its access logs and the load
# balancer's logs go to.

resource "aws_s3_bucket" "checkpoints" {
  #checkov:skip=CKV_AWS_144:Checkpoints are working state that a job can recreate by running again; cross-region replication would double storage and transfer cost for no recovery the versioning here does not give.
  #checkov:skip=CKV2_AWS_62:Nothing consumes bucket events; spotplane learns of checkpoints from the agent's manifest, written last.
  bucket = local.checkpoint_bucket
  tags   = local.tags
}

resource "aws_s3_bucket_ownership_controls" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "checkpoints" {
  bucket                  = aws_s3_bucket.checkpoints.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id

  rule {
    bucket_key_enabled = true

    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.this.arn
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id

  # Old checkpoints: spotplane resumes from the newest; older ones only cost money.
  rule {
    id     = "old-checkpoints"
    status = "Enabled"

    filter {
      prefix = var.checkpoint_prefix
    }

    dynamic "expiration" {
      for_each = var.checkpoint_retention_days > 0 ? [var.checkpoint_retention_days] : []
      content {
        days = expiration.value
      }
    }

    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_retention_days
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }
  }

  # A node taken mid-upload leaves parts behind; they are billed until aborted.
  rule {
    id     = "incomplete-uploads-and-delete-markers"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }

    expiration {
      expired_object_delete_marker = true
    }
  }

  depends_on = [aws_s3_bucket_versioning.checkpoints]
}

resource "aws_s3_bucket_logging" "checkpoints" {
  bucket        = aws_s3_bucket.checkpoints.id
  target_bucket = aws_s3_bucket.logs.id
  target_prefix = "s3/${local.checkpoint_bucket}/"
}

resource "aws_s3_bucket_policy" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  policy = data.aws_iam_policy_document.checkpoints_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.checkpoints]
}

data "aws_iam_policy_document" "checkpoints_bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.checkpoints.arn,
      "${aws_s3_bucket.checkpoints.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

# Logs: S3 server access logs of the checkpoint bucket and the load balancer's access logs.
resource "aws_s3_bucket" "logs" {
  #checkov:skip=CKV_AWS_18:This is the access-log bucket; logging it into itself would loop.
  #checkov:skip=CKV_AWS_144:Access logs are kept for audit in this region; replicating them is a choice for the account's central logging, not this module.
  #checkov:skip=CKV2_AWS_62:Nothing consumes events of the log bucket.
  #checkov:skip=CKV_AWS_145:Elastic Load Balancing writes access logs only to buckets encrypted with S3-managed keys (SSE-S3), not KMS.
  bucket = local.logs_bucket
  tags   = local.tags
}

resource "aws_s3_bucket_ownership_controls" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "logs" {
  bucket                  = aws_s3_bucket.logs.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "logs" {
  bucket = aws_s3_bucket.logs.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    id     = "expire-logs"
    status = "Enabled"

    filter {}

    expiration {
      days = var.log_retention_days
    }

    noncurrent_version_expiration {
      noncurrent_days = 7
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }
  }

  depends_on = [aws_s3_bucket_versioning.logs]
}

resource "aws_s3_bucket_policy" "logs" {
  bucket = aws_s3_bucket.logs.id
  policy = data.aws_iam_policy_document.logs_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.logs]
}

data "aws_elb_service_account" "current" {}

data "aws_iam_policy_document" "logs_bucket" {
  statement {
    sid       = "S3ServerAccessLogs"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs.arn}/s3/*"]

    principals {
      type        = "Service"
      identifiers = ["logging.s3.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [aws_s3_bucket.checkpoints.arn]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
  }

  # Regions opened before August 2022 deliver as the regional ELB account; newer ones as the
  # log delivery service.
  statement {
    sid       = "LoadBalancerAccessLogs"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs.arn}/alb/AWSLogs/${local.account}/*"]

    principals {
      type        = "AWS"
      identifiers = [data.aws_elb_service_account.current.arn]
    }
  }

  statement {
    sid       = "LoadBalancerLogDelivery"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs.arn}/alb/AWSLogs/${local.account}/*"]

    principals {
      type        = "Service"
      identifiers = ["logdelivery.elasticloadbalancing.amazonaws.com"]
    }
  }

  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.logs.arn,
      "${aws_s3_bucket.logs.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}
