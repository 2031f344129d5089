# The checkpoint bucket (object_store.url): uniform access, public access prevented, versioned,
# old checkpoints and old versions expired.

resource "google_storage_bucket" "checkpoints" {
  #checkov:skip=CKV_GCP_62:Access is recorded by Cloud Audit Logs (enable Data Access logs for Cloud Storage, docs/deploy.md); legacy usage logs would need a second bucket.
  project                     = var.project
  name                        = local.bucket
  location                    = var.bucket_location == "" ? var.region : var.bucket_location
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false
  labels                      = local.labels

  versioning {
    enabled = true
  }

  dynamic "lifecycle_rule" {
    for_each = var.checkpoint_retention_days > 0 ? [var.checkpoint_retention_days] : []
    content {
      condition {
        age            = lifecycle_rule.value
        matches_prefix = [var.checkpoint_prefix]
        with_state     = "LIVE"
      }
      action {
        type = "Delete"
      }
    }
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = var.noncurrent_retention_days
      with_state                 = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      age = 2
    }
    action {
      type = "AbortIncompleteMultipartUpload"
    }
  }

  depends_on = [google_project_service.this]
}
