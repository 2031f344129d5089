# PostgreSQL (database.url): Cloud SQL with a private IP only, TLS required. The URL, password
# included, lives in Secret Manager; the module outputs only the secret's id.

resource "random_id" "db_suffix" {
  # Cloud SQL keeps a deleted instance's name for a week; a suffix lets a new one be made.
  byte_length = 3
}

resource "google_sql_database_instance" "this" {
  #checkov:skip=CKV_GCP_6:TLS is required (ssl_mode ENCRYPTED_ONLY); client certificates are not, because spotplane connects with a DATABASE_URL and a password, and the instance has no public address.
  #checkov:skip=CKV_GCP_79:The default (POSTGRES_16) is chosen, not the newest: move db_version once spotplane's migrations have been run on the newer major (its tests run on PostgreSQL 15).
  project             = var.project
  name                = "${var.name}-db-${random_id.db_suffix.hex}"
  region              = var.region
  database_version    = var.db_version
  deletion_protection = var.deletion_protection

  settings {
    # edition: unset, the Cloud SQL API picks ENTERPRISE_PLUS for POSTGRES_16 and later, which
    # refuses custom and shared-core tiers (the default db-custom-1-3840): name the one the tier needs.
    tier                        = var.db_tier
    edition                     = can(regex("^db-perf-optimized-", var.db_tier)) ? "ENTERPRISE_PLUS" : "ENTERPRISE"
    availability_type           = var.db_availability_type
    disk_type                   = "PD_SSD"
    disk_size                   = var.db_disk_size_gb
    disk_autoresize             = true
    deletion_protection_enabled = var.deletion_protection
    user_labels                 = local.labels

    ip_configuration {
      ipv4_enabled    = false
      private_network = local.network_id
      ssl_mode        = "ENCRYPTED_ONLY"
    }

    backup_configuration {
      enabled                        = true
      point_in_time_recovery_enabled = true
      start_time                     = "03:00"
      transaction_log_retention_days = 7

      backup_retention_settings {
        retained_backups = var.db_backup_retention_count
        retention_unit   = "COUNT"
      }
    }

    maintenance_window {
      day          = 7
      hour         = 4
      update_track = "stable"
    }

    insights_config {
      query_insights_enabled  = true
      record_application_tags = false
      record_client_address   = false
    }

    database_flags {
      name  = "log_checkpoints"
      value = "on"
    }

    database_flags {
      name  = "log_connections"
      value = "on"
    }

    database_flags {
      name  = "log_disconnections"
      value = "on"
    }

    database_flags {
      name  = "log_lock_waits"
      value = "on"
    }

    database_flags {
      name  = "log_temp_files"
      value = "0"
    }

    database_flags {
      name  = "log_min_messages"
      value = "error"
    }

    database_flags {
      name  = "log_min_duration_statement"
      value = "-1"
    }

    database_flags {
      name  = "log_min_error_statement"
      value = "error"
    }

    database_flags {
      name  = "log_hostname"
      value = "on"
    }

    database_flags {
      name  = "log_duration"
      value = "on"
    }

    database_flags {
      name  = "log_statement"
      value = "ddl"
    }

    database_flags {
      name  = "cloudsql.enable_pgaudit"
      value = "on"
    }
  }

  depends_on = [google_service_networking_connection.private_services, google_project_service.this]
}

resource "google_sql_database" "spotplane" {
  project  = var.project
  instance = google_sql_database_instance.this.name
  name     = "spotplane"
}

resource "random_password" "db" {
  length  = 40
  special = false
}

resource "google_sql_user" "spotplane" {
  project  = var.project
  instance = google_sql_database_instance.this.name
  name     = "spotplane"
  password = random_password.db.result
}

# database.url, password included: Cloud Run reads it into DATABASE_URL; never output.
resource "google_secret_manager_secret" "database_url" {
  project   = var.project
  secret_id = "${var.name}-database-url"
  labels    = local.labels

  replication {
    auto {}
  }

  depends_on = [google_project_service.this]
}

resource "google_secret_manager_secret_version" "database_url" {
  secret      = google_secret_manager_secret.database_url.id
  secret_data = "postgres://spotplane:${random_password.db.result}@${google_sql_database_instance.this.private_ip_address}:5432/spotplane?sslmode=require"
}

# SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN: stored as the first admin token when there is none yet.
resource "random_password" "bootstrap_admin_token" {
  length  = 64
  special = false
}

resource "google_secret_manager_secret" "bootstrap_admin_token" {
  project   = var.project
  secret_id = "${var.name}-bootstrap-admin-token"
  labels    = local.labels

  replication {
    auto {}
  }

  depends_on = [google_project_service.this]
}

resource "google_secret_manager_secret_version" "bootstrap_admin_token" {
  secret      = google_secret_manager_secret.bootstrap_admin_token.id
  secret_data = random_password.bootstrap_admin_token.result
}

# SPOTPLANE_SECRETS__KEY: the key team secrets are encrypted with in the database. Every
# revision gets the same one (Cloud Run has no lasting disk); losing it loses every team secret
# (docs/deploy.md).
resource "random_bytes" "secrets_key" {
  length = 32
}

resource "google_secret_manager_secret" "secrets_key" {
  project   = var.project
  secret_id = "${var.name}-secrets-key"
  labels    = local.labels

  replication {
    auto {}
  }

  depends_on = [google_project_service.this]
}

resource "google_secret_manager_secret_version" "secrets_key" {
  secret      = google_secret_manager_secret.secrets_key.id
  secret_data = random_bytes.secrets_key.base64
}
