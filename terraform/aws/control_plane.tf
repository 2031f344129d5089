# The control plane: ECS Fargate tasks in private subnets behind an internal HTTPS load
# balancer at control_plane_hostname. Agents on GPU nodes and allowed networks reach it on 443;
# the tasks reach PostgreSQL, the AWS APIs and nothing else.

# --- Security groups ---------------------------------------------------------------------------

resource "aws_security_group" "alb" {
  name        = "${var.name}-control-plane-lb"
  description = "spotplane ${var.name}: the control plane load balancer"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.name}-control-plane-lb" })
}

resource "aws_vpc_security_group_ingress_rule" "alb_from_nodes" {
  security_group_id            = aws_security_group.alb.id
  description                  = "Agents on GPU nodes"
  ip_protocol                  = "tcp"
  from_port                    = 443
  to_port                      = 443
  referenced_security_group_id = aws_security_group.node.id
  tags                         = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "alb_from_allowed" {
  for_each = toset(var.api_allowed_cidrs)

  security_group_id = aws_security_group.alb.id
  description       = "API clients from ${each.value}"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = each.value
  tags              = local.tags
}

resource "aws_vpc_security_group_egress_rule" "alb_to_tasks" {
  security_group_id            = aws_security_group.alb.id
  description                  = "To the control plane tasks"
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8080
  referenced_security_group_id = aws_security_group.control_plane.id
  tags                         = local.tags
}

resource "aws_security_group" "control_plane" {
  name        = "${var.name}-control-plane"
  description = "spotplane ${var.name}: control plane tasks"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.name}-control-plane" })
}

resource "aws_vpc_security_group_ingress_rule" "tasks_from_alb" {
  security_group_id            = aws_security_group.control_plane.id
  description                  = "From the load balancer"
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8080
  referenced_security_group_id = aws_security_group.alb.id
  tags                         = local.tags
}

resource "aws_vpc_security_group_egress_rule" "tasks_to_db" {
  security_group_id            = aws_security_group.control_plane.id
  description                  = "To PostgreSQL"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.db.id
  tags                         = local.tags
}

resource "aws_vpc_security_group_egress_rule" "tasks_to_aws_apis" {
  security_group_id = aws_security_group.control_plane.id
  description       = "HTTPS to the AWS APIs (EC2, SQS, S3, Secrets Manager, ECR) and the image registry"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
  tags              = local.tags
}

resource "aws_security_group" "db" {
  name        = "${var.name}-db"
  description = "spotplane ${var.name}: PostgreSQL, from the control plane only"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.name}-db" })
}

resource "aws_vpc_security_group_ingress_rule" "db_from_tasks" {
  security_group_id            = aws_security_group.db.id
  description                  = "PostgreSQL from the control plane tasks"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.control_plane.id
  tags                         = local.tags
}

# --- Load balancer -------------------------------------------------------------------------------

resource "aws_lb" "control_plane" {
  #checkov:skip=CKV2_AWS_28:The load balancer is internal (reachable from the VPC and api_allowed_cidrs only) and every API call needs a bearer token; attach a WAF web ACL where policy requires one.
  name                       = "${var.name}-cp"
  internal                   = true
  load_balancer_type         = "application"
  security_groups            = [aws_security_group.alb.id]
  subnets                    = var.private_subnet_ids
  drop_invalid_header_fields = true
  enable_deletion_protection = var.deletion_protection
  idle_timeout               = 120
  tags                       = local.tags

  access_logs {
    bucket  = aws_s3_bucket.logs.id
    prefix  = "alb"
    enabled = true
  }

  depends_on = [aws_s3_bucket_policy.logs]
}

resource "aws_lb_target_group" "control_plane" {
  #checkov:skip=CKV_AWS_378:TLS ends at the load balancer; the hop to the tasks stays inside private subnets, and the tasks' security group admits only the load balancer.
  name                 = "${var.name}-cp"
  port                 = 8080
  protocol             = "HTTP"
  target_type          = "ip"
  vpc_id               = var.vpc_id
  deregistration_delay = 30
  tags                 = local.tags

  health_check {
    path                = "/readyz"
    matcher             = "200"
    interval            = 15
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }
}

resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.control_plane.arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  certificate_arn   = var.certificate_arn
  tags              = local.tags

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.control_plane.arn
  }
}

resource "aws_route53_record" "control_plane" {
  count = var.route53_zone_id == "" ? 0 : 1

  zone_id = var.route53_zone_id
  name    = var.control_plane_hostname
  type    = "A"

  alias {
    name                   = aws_lb.control_plane.dns_name
    zone_id                = aws_lb.control_plane.zone_id
    evaluate_target_health = true
  }
}

# --- ECS -----------------------------------------------------------------------------------------

resource "aws_ecs_cluster" "this" {
  name = var.name
  tags = local.tags

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

resource "aws_cloudwatch_log_group" "control_plane" {
  name              = "/spotplane/${var.name}/control-plane"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.this.arn
  tags              = local.tags
}

locals {
  log_configuration = {
    logDriver = "awslogs"
    options = {
      awslogs-group         = aws_cloudwatch_log_group.control_plane.name
      awslogs-region        = local.region
      awslogs-stream-prefix = "spotplane"
    }
  }

  # The rendered spotplane.toml reaches the task through the config writer (a container that
  # runs first and writes it into a task volume): Fargate has no file injection, and the file
  # holds no secret.
  containers = [
    {
      name                   = "config"
      image                  = var.config_writer_image
      essential              = false
      readonlyRootFilesystem = true
      command                = ["sh", "-c", "printf '%s' \"$SPOTPLANE_CONFIG_TOML\" > /etc/spotplane/spotplane.toml"]
      environment            = [{ name = "SPOTPLANE_CONFIG_TOML", value = local.config_toml }]
      mountPoints            = [{ sourceVolume = "config", containerPath = "/etc/spotplane", readOnly = false }]
      logConfiguration       = local.log_configuration
    },
    {
      name                   = "spotplane"
      image                  = var.control_plane_image
      essential              = true
      readonlyRootFilesystem = true
      command                = ["serve", "--config", "/etc/spotplane/spotplane.toml"]
      portMappings           = [{ containerPort = 8080, protocol = "tcp" }]
      environment = [
        { name = "AWS_REGION", value = local.region },
      ]
      secrets = [
        { name = "DATABASE_URL", valueFrom = aws_secretsmanager_secret.database_url.arn },
        { name = "SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN", valueFrom = aws_secretsmanager_secret.bootstrap_admin_token.arn },
        { name = "SPOTPLANE_SECRETS__KEY", valueFrom = aws_secretsmanager_secret.secrets_key.arn },
      ]
      mountPoints      = [{ sourceVolume = "config", containerPath = "/etc/spotplane", readOnly = true }]
      dependsOn        = [{ containerName = "config", condition = "SUCCESS" }]
      stopTimeout      = 30
      logConfiguration = local.log_configuration
    },
  ]
}

resource "aws_ecs_task_definition" "control_plane" {
  family                   = "${var.name}-control-plane"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.control_plane_cpu
  memory                   = var.control_plane_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.control_plane.arn
  container_definitions    = jsonencode(local.containers)
  tags                     = local.tags

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.cpu_architecture
  }

  volume {
    name = "config"
  }
}

resource "aws_ecs_service" "control_plane" {
  name                               = "${var.name}-control-plane"
  cluster                            = aws_ecs_cluster.this.id
  task_definition                    = aws_ecs_task_definition.control_plane.arn
  desired_count                      = var.control_plane_replicas
  launch_type                        = "FARGATE"
  platform_version                   = "LATEST"
  deployment_minimum_healthy_percent = 50
  deployment_maximum_percent         = 200
  health_check_grace_period_seconds  = 120
  enable_ecs_managed_tags            = true
  propagate_tags                     = "SERVICE"
  tags                               = local.tags

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.control_plane.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.control_plane.arn
    container_name   = "spotplane"
    container_port   = 8080
  }

  # A release whose tasks do not become healthy is rolled back to the previous task definition.
  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  depends_on = [aws_lb_listener.https, aws_iam_role_policy.control_plane]
}
