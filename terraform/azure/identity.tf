# User-assigned identities and their roles. The control plane: a custom role on the nodes'
# resource group holding the Resource Manager actions of providers/src/azure (create, read,
# list and delete VMs with their inline NIC and disk), joining the node subnet, blob data in
# the checkpoint container (a custom role: data actions only), and its two secrets. The nodes: blobs under the checkpoint prefix.

resource "azurerm_user_assigned_identity" "control_plane" {
  name                = "${var.name}-control-plane"
  location            = var.location
  resource_group_name = azurerm_resource_group.control.name
  tags                = local.tags
}

resource "azurerm_user_assigned_identity" "node" {
  name                = "${var.name}-node"
  location            = var.location
  resource_group_name = azurerm_resource_group.control.name
  tags                = local.tags
}

# Custom role names are unique in the whole tenant: the suffix keeps two clusters of one name
# (in two subscriptions) apart.
resource "azurerm_role_definition" "node_vms" {
  name        = "spotplane ${var.name} node VMs (${random_id.suffix.hex})"
  scope       = azurerm_resource_group.nodes.id
  description = "spotplane control plane (${var.name}): create, read, list and delete Spot VMs, their NICs and disks, in the nodes' resource group."

  permissions {
    actions = [
      "Microsoft.Compute/virtualMachines/read",
      "Microsoft.Compute/virtualMachines/write",
      "Microsoft.Compute/virtualMachines/delete",
      "Microsoft.Compute/virtualMachines/instanceView/read",
      "Microsoft.Compute/disks/read",
      "Microsoft.Compute/disks/write",
      "Microsoft.Compute/disks/delete",
      "Microsoft.Network/networkInterfaces/read",
      "Microsoft.Network/networkInterfaces/write",
      "Microsoft.Network/networkInterfaces/delete",
      "Microsoft.Network/networkInterfaces/join/action",
    ]
    not_actions = []
  }

  assignable_scopes = [azurerm_resource_group.nodes.id]
}

resource "azurerm_role_assignment" "control_plane_node_vms" {
  scope              = azurerm_resource_group.nodes.id
  role_definition_id = azurerm_role_definition.node_vms.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.control_plane.principal_id
  principal_type     = "ServicePrincipal"
}

resource "azurerm_role_definition" "node_subnet" {
  name        = "spotplane ${var.name} node subnet (${random_id.suffix.hex})"
  scope       = azurerm_subnet.nodes.id
  description = "spotplane control plane (${var.name}): put node NICs in the node subnet."

  permissions {
    actions = [
      "Microsoft.Network/virtualNetworks/subnets/read",
      "Microsoft.Network/virtualNetworks/subnets/join/action",
    ]
    not_actions = []
  }

  assignable_scopes = [azurerm_subnet.nodes.id]
}

resource "azurerm_role_assignment" "control_plane_node_subnet" {
  scope              = azurerm_subnet.nodes.id
  role_definition_id = azurerm_role_definition.node_subnet.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.control_plane.principal_id
  principal_type     = "ServicePrincipal"
}

# Blob data only: Storage Blob Data Contributor would add managing (deleting) the container.
resource "azurerm_role_definition" "checkpoint_blobs" {
  name        = "spotplane ${var.name} checkpoint blobs (${random_id.suffix.hex})"
  scope       = azurerm_storage_account.checkpoints.id
  description = "spotplane (${var.name}): read, write, list and delete checkpoint blobs; nothing on the container itself."

  permissions {
    actions = []
    data_actions = [
      "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read",
      "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write",
      "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action",
      "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/delete",
    ]
    not_actions      = []
    not_data_actions = []
  }

  assignable_scopes = [azurerm_storage_account.checkpoints.id]
}

resource "azurerm_role_assignment" "control_plane_checkpoints" {
  scope              = azurerm_storage_container.checkpoints.id
  role_definition_id = azurerm_role_definition.checkpoint_blobs.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.control_plane.principal_id
  principal_type     = "ServicePrincipal"
}

resource "azurerm_role_assignment" "control_plane_secrets" {
  for_each = {
    database-url          = azurerm_key_vault_secret.database_url.resource_versionless_id
    bootstrap-admin-token = azurerm_key_vault_secret.bootstrap_admin_token.resource_versionless_id
    secrets-key           = azurerm_key_vault_secret.secrets_key.resource_versionless_id
  }

  scope                = each.value
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.control_plane.principal_id
  principal_type       = "ServicePrincipal"
}

# Nodes: blobs under the checkpoint prefix only, by an attribute-based condition: reads,
# writes and deletes must name a path under it, and listing must ask for a prefix under it.
resource "azurerm_role_assignment" "node_checkpoints" {
  scope              = azurerm_storage_container.checkpoints.id
  role_definition_id = azurerm_role_definition.checkpoint_blobs.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.node.principal_id
  principal_type     = "ServicePrincipal"
  description        = "spotplane nodes (${var.name}): blobs under ${var.checkpoint_prefix}"
  condition_version  = "2.0"
  condition          = <<-EOT
    (
      (
        !(ActionMatches{'Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read'} AND NOT SubOperationMatches{'Blob.List'})
        AND !(ActionMatches{'Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write'})
        AND !(ActionMatches{'Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action'})
        AND !(ActionMatches{'Microsoft.Storage/storageAccounts/blobServices/containers/blobs/delete'})
      )
      OR
      (
        @Resource[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:path] StringStartsWith '${var.checkpoint_prefix}'
      )
    )
    AND
    (
      (
        !(ActionMatches{'Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read'} AND SubOperationMatches{'Blob.List'})
      )
      OR
      (
        @Request[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:prefix] StringStartsWith '${var.checkpoint_prefix}'
      )
    )
  EOT
}
