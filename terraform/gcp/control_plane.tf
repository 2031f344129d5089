# The control plane on Cloud Run: always-allocated CPU (the reconcilers run between requests),
# at least control_plane_replicas instances, internal ingress (the VPC and its nodes), Direct
# VPC egress to Cloud SQL's private IP. spotplane authenticates every request itself (bearer
# tokens), so Cloud Run's IAM check is open to callers that reach the internal ingress.

# spotplane.toml, mounted as a file (Cloud Run mounts files from Secret Manager only); it holds
# no secret.
resource "google_secret_manager_secret" "config" {
  project   = var.project
  secret_id = "${var.name}-config"
  labels    = local.labels

  replication {
    auto {}
  }

  depends_on = [google_project_service.this]
}

resource "google_secret_manager_secret_version" "config" {
  secret      = google_secret_manager_secret.config.id
  secret_data = local.config_toml
}

resource "google_cloud_run_v2_service" "control_plane" {
  project  = var.project
  name     = "${var.name}-control-plane"
  location = var.region
  ingress  = "INGRESS_TRAFFIC_INTERNAL_ONLY"
  labels   = local.labels

  # Provider 6.0 added deletion_protection here, default true: follow the module's switch so
  # deletion_protection = false lets terraform destroy remove the service.
  deletion_protection = var.deletion_protection

  template {
    service_account = google_service_account.control_plane.email
    labels          = local.labels

    scaling {
      min_instance_count = var.control_plane_replicas
      max_instance_count = var.control_plane_replicas
    }

    vpc_access {
      egress = "PRIVATE_RANGES_ONLY"

      network_interfaces {
        network    = var.network
        subnetwork = var.subnetwork
      }
    }

    containers {
      image = var.control_plane_image
      args  = ["serve", "--config", "/etc/spotplane/spotplane.toml"]

      ports {
        container_port = 8080
      }

      env {
        name = "DATABASE_URL"
        value_source {
          secret_key_ref {
            secret  = google_secret_manager_secret.database_url.secret_id
            version = google_secret_manager_secret_version.database_url.version
          }
        }
      }

      env {
        name = "SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN"
        value_source {
          secret_key_ref {
            secret  = google_secret_manager_secret.bootstrap_admin_token.secret_id
            version = google_secret_manager_secret_version.bootstrap_admin_token.version
          }
        }
      }

      env {
        name = "SPOTPLANE_SECRETS__KEY"
        value_source {
          secret_key_ref {
            secret  = google_secret_manager_secret.secrets_key.secret_id
            version = google_secret_manager_secret_version.secrets_key.version
          }
        }
      }

      resources {
        limits = {
          cpu    = var.control_plane_cpu
          memory = var.control_plane_memory
        }
        cpu_idle = false
      }

      startup_probe {
        http_get {
          path = "/readyz"
        }
        period_seconds    = 5
        failure_threshold = 24
      }

      liveness_probe {
        http_get {
          path = "/healthz"
        }
        period_seconds = 15
      }

      volume_mounts {
        name       = "config"
        mount_path = "/etc/spotplane"
      }
    }

    volumes {
      name = "config"
      secret {
        secret = google_secret_manager_secret.config.secret_id
        items {
          version = google_secret_manager_secret_version.config.version
          path    = "spotplane.toml"
        }
      }
    }
  }

  traffic {
    type    = "TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST"
    percent = 100
  }

  depends_on = [
    google_secret_manager_secret_iam_member.control_plane,
    google_project_service.this,
  ]
}

# Agents cannot present Google identity tokens; the ingress is internal and spotplane checks
# its own bearer token on every call.
resource "google_cloud_run_v2_service_iam_member" "invoker" {
  project  = var.project
  location = google_cloud_run_v2_service.control_plane.location
  name     = google_cloud_run_v2_service.control_plane.name
  role     = "roles/run.invoker"
  member   = "allUsers"
}
