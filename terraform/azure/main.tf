# spotplane on Azure: PostgreSQL Flexible Server in a delegated subnet, the checkpoint storage
# account and container, user-assigned identities with the roles they need (the nodes' resource
# group, the node subnet, the container, the two secrets), Key Vault, the control plane on
# Container Apps in an internal environment, and the cloud-init custom data of Spot VMs.
# docs/deploy.md walks through it.

data "azurerm_client_config" "current" {}
data "azurerm_subscription" "current" {}

resource "random_id" "suffix" {
  # Globally unique names (Key Vault, storage account, database server).
  byte_length = 3
}

locals {
  # The control plane's cluster tag (providers/src/lib.rs, tags::CLUSTER) goes on everything.
  tags = merge(var.tags, { "spotplane-cluster" = var.name })

  compact_name    = substr(replace(var.name, "-", ""), 0, 14)
  key_vault_name  = "kv-${substr(var.name, 0, 14)}-${random_id.suffix.hex}"
  storage_account = "${local.compact_name}ckpt${random_id.suffix.hex}"
  container       = "spotplane"

  object_store_url = "az://${local.storage_account}/${local.container}/${trimsuffix(var.checkpoint_prefix, "/")}"

  token_file = "/etc/spotplane/bootstrap-token"

  node_boot_script = templatefile("${path.module}/../templates/node-boot.sh.tftpl", {
    cloud             = "azure"
    control_plane_url = local.control_plane_url
    token_file        = local.token_file
    work_dir          = var.agent_work_dir
    agent_url         = var.agent_url
    agent_sha256      = var.agent_sha256
  })

  # What the control plane reads; DATABASE_URL comes from Key Vault, never from this file.
  config_toml = templatefile("${path.module}/templates/spotplane.toml.tftpl", {
    object_store_url = local.object_store_url
    subscription_id  = data.azurerm_subscription.current.subscription_id
    resource_group   = azurerm_resource_group.nodes.name
    locations        = [var.location]
    subnet_id        = azurerm_subnet.nodes.id
    image            = var.image
    admin_username   = var.admin_username
    ssh_public_key   = var.ssh_public_key
    eviction_policy  = var.eviction_policy
    max_price_usd    = format("%.4f", var.max_price_usd)
    vm_sizes         = var.vm_sizes
  })
}

resource "azurerm_resource_group" "control" {
  name     = "${var.name}-control"
  location = var.location
  tags     = local.tags
}

# Nodes live in their own resource group: the control plane's role is scoped to it.
resource "azurerm_resource_group" "nodes" {
  name     = "${var.name}-nodes"
  location = var.location
  tags     = local.tags
}
