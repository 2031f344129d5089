# PostgreSQL (database.url): RDS, encrypted with the cluster key, in private subnets, reachable
# only from the control plane. The URL, password included, lives in Secrets Manager; the module
# outputs only the secret's ARN.

locals {
  db_identifier = "${var.name}-db"
  db_family     = "postgres${split(".", var.db_engine_version)[0]}"
}

resource "aws_db_subnet_group" "this" {
  name        = "${var.name}-db"
  description = "spotplane ${var.name} database subnets"
  subnet_ids  = var.private_subnet_ids
  tags        = local.tags
}

resource "aws_db_parameter_group" "this" {
  # A prefix, not a name: a new major version replaces the group before the old one goes.
  name_prefix = "${var.name}-${local.db_family}-"
  family      = local.db_family
  description = "spotplane ${var.name}: TLS only, slow statements logged"
  tags        = local.tags

  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }

  parameter {
    name  = "log_min_duration_statement"
    value = "1000"
  }

  lifecycle {
    create_before_destroy = true
  }
}

# RDS writes its logs here once they exist; made first so they are encrypted and expire.
resource "aws_cloudwatch_log_group" "db" {
  for_each = toset(["postgresql", "upgrade"])

  name              = "/aws/rds/instance/${local.db_identifier}/${each.key}"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.this.arn
  tags              = local.tags
}

resource "random_password" "db" {
  length  = 40
  special = false
}

resource "aws_db_instance" "this" {
  identifier     = local.db_identifier
  engine         = "postgres"
  engine_version = var.db_engine_version
  instance_class = var.db_instance_class

  db_name  = "spotplane"
  username = "spotplane"
  password = random_password.db.result
  port     = 5432

  allocated_storage     = var.db_allocated_storage_gb
  max_allocated_storage = var.db_max_allocated_storage_gb
  storage_type          = "gp3"
  storage_encrypted     = true
  kms_key_id            = aws_kms_key.this.arn

  db_subnet_group_name   = aws_db_subnet_group.this.name
  vpc_security_group_ids = [aws_security_group.db.id]
  parameter_group_name   = aws_db_parameter_group.this.name
  publicly_accessible    = false
  multi_az               = var.db_multi_az

  backup_retention_period   = var.db_backup_retention_days
  copy_tags_to_snapshot     = true
  deletion_protection       = var.deletion_protection
  skip_final_snapshot       = false
  final_snapshot_identifier = "${local.db_identifier}-final"

  auto_minor_version_upgrade          = true
  allow_major_version_upgrade         = false
  iam_database_authentication_enabled = true
  enabled_cloudwatch_logs_exports     = ["postgresql", "upgrade"]

  performance_insights_enabled          = true
  performance_insights_kms_key_id       = aws_kms_key.this.arn
  performance_insights_retention_period = 7

  monitoring_interval = 60
  monitoring_role_arn = aws_iam_role.rds_monitoring.arn

  tags = local.tags

  depends_on = [aws_cloudwatch_log_group.db, aws_iam_role_policy_attachment.rds_monitoring]
}

resource "aws_iam_role" "rds_monitoring" {
  name               = "${var.name}-rds-monitoring"
  assume_role_policy = data.aws_iam_policy_document.rds_monitoring_assume.json
  tags               = local.tags
}

data "aws_iam_policy_document" "rds_monitoring_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["monitoring.rds.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy_attachment" "rds_monitoring" {
  role       = aws_iam_role.rds_monitoring.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonRDSEnhancedMonitoringRole"
}

# database.url, password included: read by ECS into DATABASE_URL, never output.
resource "aws_secretsmanager_secret" "database_url" {
  #checkov:skip=CKV2_AWS_57:spotplane reads DATABASE_URL at start-up; rotating it is the documented procedure in docs/deploy.md (new password, then a rolling restart), not a Lambda that would change it under running tasks.
  name                    = "spotplane/${var.name}/database-url"
  description             = "DATABASE_URL of the spotplane control plane (${var.name})"
  kms_key_id              = aws_kms_key.this.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret_version" "database_url" {
  secret_id     = aws_secretsmanager_secret.database_url.id
  secret_string = "postgres://spotplane:${random_password.db.result}@${aws_db_instance.this.address}:${aws_db_instance.this.port}/spotplane?sslmode=require"
}

# SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN: stored as the first admin token when there is none yet.
resource "random_password" "bootstrap_admin_token" {
  length  = 64
  special = false
}

resource "aws_secretsmanager_secret" "bootstrap_admin_token" {
  #checkov:skip=CKV2_AWS_57:Used once, at the first start, to create the first admin token; revoke that token after creating personal ones (docs/deploy.md). Rotation would not change the stored token.
  name                    = "spotplane/${var.name}/bootstrap-admin-token"
  description             = "SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN of the spotplane control plane (${var.name})"
  kms_key_id              = aws_kms_key.this.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret_version" "bootstrap_admin_token" {
  secret_id     = aws_secretsmanager_secret.bootstrap_admin_token.id
  secret_string = random_password.bootstrap_admin_token.result
}

# SPOTPLANE_SECRETS__KEY: the key team secrets are encrypted with in the database. Every task
# gets the same one (their filesystems are read-only and short-lived); losing it loses every
# team secret (docs/deploy.md).
resource "random_bytes" "secrets_key" {
  length = 32
}

resource "aws_secretsmanager_secret" "secrets_key" {
  #checkov:skip=CKV2_AWS_57:A new key would leave every stored team secret unreadable: spotplane does not re-encrypt them (docs/deploy.md).
  name                    = "spotplane/${var.name}/secrets-key"
  description             = "SPOTPLANE_SECRETS__KEY of the spotplane control plane (${var.name}): the key team secrets are encrypted with"
  kms_key_id              = aws_kms_key.this.arn
  recovery_window_in_days = 30
  tags                    = local.tags
}

resource "aws_secretsmanager_secret_version" "secrets_key" {
  secret_id     = aws_secretsmanager_secret.secrets_key.id
  secret_string = random_bytes.secrets_key.base64
}
