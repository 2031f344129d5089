# What the control plane's configuration needs (config/examples/clouds.toml, the [[providers]]
# table of kind "aws"), plus references to the secrets. No output holds a secret.

output "database_url_secret" {
  description = "ARN of the Secrets Manager secret holding DATABASE_URL (database.url). A reference: read it with secretsmanager:GetSecretValue."
  value       = aws_secretsmanager_secret.database_url.arn
}

output "bootstrap_admin_token_secret" {
  description = "ARN of the Secrets Manager secret holding SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN (the first admin token)."
  value       = aws_secretsmanager_secret.bootstrap_admin_token.arn
}

output "object_store_url" {
  description = "object_store.url: where checkpoints go (s3://bucket/prefix)."
  value       = local.object_store_url
}

output "checkpoint_bucket" {
  description = "Name of the checkpoint bucket."
  value       = aws_s3_bucket.checkpoints.id
}

output "interruption_queue_url" {
  description = "providers.interruption_queue_url: the SQS queue the EventBridge rules feed."
  value       = aws_sqs_queue.interruptions.url
}

output "interruption_rules" {
  description = "The EventBridge rules feeding the queue, by kind: their ARNs."
  value       = { for k, r in aws_cloudwatch_event_rule.interruption : k => r.arn }
}

output "regions" {
  description = "providers.regions: the region nodes are bought in (this module's)."
  value       = local.regions
}

output "image_id" {
  description = "providers.image_id: the AMI nodes boot."
  value       = var.image_id
}

output "launch_api" {
  description = "providers.launch_api: create_fleet or run_instances."
  value       = var.launch_api
}

output "price_list" {
  description = "providers.price_list: on-demand prices from the AWS Price List Query API."
  value       = var.price_list
}

output "price_list_region" {
  description = "providers.price_list_region: the Price List endpoint's region."
  value       = var.price_list_region
}

output "instance_types" {
  description = "providers.instance_types: GPU instance types offered (empty: the catalog's)."
  value       = var.instance_types
}

output "subnets" {
  description = "providers.subnets: the node subnet per availability zone name."
  value       = var.node_subnets
}

output "security_group_ids" {
  description = "providers.security_group_ids: the node security group."
  value       = [aws_security_group.node.id]
}

output "instance_profile" {
  description = "providers.instance_profile: the instance profile (name) nodes run as; it reaches only the checkpoint prefix."
  value       = aws_iam_instance_profile.node.name
}

output "node_launch_template_id" {
  description = "The GPU node launch template (IMDSv2 required, agent started from user data)."
  value       = aws_launch_template.node.id
}

output "node_boot_script" {
  description = "The node boot script (user data) that installs and starts spotplane-agent; the control plane puts the node's bootstrap token file ahead of it."
  value       = local.node_boot_script
}

output "control_plane_url" {
  description = "The URL agents (--control-plane) and API clients use."
  value       = local.control_plane_url
}

output "control_plane_load_balancer_dns_name" {
  description = "DNS name of the internal load balancer; point control_plane_hostname at it when route53_zone_id is empty."
  value       = aws_lb.control_plane.dns_name
}

output "config_toml" {
  description = "The spotplane.toml the control plane runs with (no secrets; DATABASE_URL comes from the secret)."
  value       = local.config_toml
}

output "kms_key_arn" {
  description = "The cluster's KMS key (checkpoints, database, secrets, logs)."
  value       = aws_kms_key.this.arn
}
