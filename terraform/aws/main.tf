# spotplane on AWS: the PostgreSQL database, the checkpoint bucket, the interruption queue fed by
# EventBridge, IAM for the control plane and the nodes, the control plane on ECS Fargate behind an
# internal load balancer, and the launch template GPU nodes boot from. docs/deploy.md walks
# through it.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  account   = data.aws_caller_identity.current.account_id
  region    = data.aws_region.current.region
  partition = data.aws_partition.current.partition

  # The control plane's cluster tag (providers/src/lib.rs, tags::CLUSTER) goes on everything.
  cluster_tag = "spotplane-cluster"
  tags        = merge(var.tags, { (local.cluster_tag) = var.name })

  # One region per module: the queue, the rules, the subnets and the node security group are
  # regional. docs/deploy.md ("More than one region") says why and what to do.
  regions = [local.region]

  checkpoint_bucket = "${var.name}-ckpt-${local.account}-${local.region}"
  logs_bucket       = "${var.name}-logs-${local.account}-${local.region}"
  object_store_url  = "s3://${local.checkpoint_bucket}/${trimsuffix(var.checkpoint_prefix, "/")}"
  control_plane_url = "https://${var.control_plane_hostname}"

  # The files on each node (the agent's --bootstrap-token-file and --work-dir).
  token_file = "/etc/spotplane/bootstrap-token"

  node_boot_script = templatefile("${path.module}/../templates/node-boot.sh.tftpl", {
    cloud             = "aws"
    control_plane_url = local.control_plane_url
    token_file        = local.token_file
    work_dir          = var.agent_work_dir
    agent_url         = var.agent_url
    agent_sha256      = var.agent_sha256
  })

  # What the control plane reads (config/examples/clouds.toml); DATABASE_URL comes from Secrets
  # Manager, never from this file.
  config_toml = templatefile("${path.module}/templates/spotplane.toml.tftpl", {
    object_store_url       = local.object_store_url
    regions                = local.regions
    image_id               = var.image_id
    launch_api             = var.launch_api
    interruption_queue_url = aws_sqs_queue.interruptions.url
    instance_types         = var.instance_types
    security_group_ids     = [aws_security_group.node.id]
    instance_profile       = aws_iam_instance_profile.node.name
    price_list             = var.price_list
    price_list_region      = var.price_list_region
    subnets                = var.node_subnets
  })
}
