# What the control plane's configuration needs (config/examples/clouds.toml, the [[providers]]
# table of kind "azure"), plus references to the secrets. No output holds a secret.

output "database_url_secret" {
  description = "Key Vault secret (versionless id) holding DATABASE_URL (database.url). A reference, not the value."
  value       = azurerm_key_vault_secret.database_url.versionless_id
}

output "bootstrap_admin_token_secret" {
  description = "Key Vault secret (versionless id) holding SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN (the first admin token)."
  value       = azurerm_key_vault_secret.bootstrap_admin_token.versionless_id
}

output "object_store_url" {
  description = "object_store.url: where checkpoints go (az://account/container/prefix)."
  value       = local.object_store_url
}

output "storage_account" {
  description = "Name of the checkpoint storage account."
  value       = azurerm_storage_account.checkpoints.name
}

output "subscription_id" {
  description = "providers.subscription_id."
  value       = data.azurerm_subscription.current.subscription_id
}

output "resource_group" {
  description = "providers.resource_group: the resource group nodes are created in (the control plane's role is scoped to it)."
  value       = azurerm_resource_group.nodes.name
}

output "locations" {
  description = "providers.locations: the location of the node subnet (one virtual network, one location)."
  value       = [var.location]
}

output "subnet_id" {
  description = "providers.subnet_id: the subnet node NICs are created in."
  value       = azurerm_subnet.nodes.id
}

output "image" {
  description = "providers.image: the image of nodes."
  value       = var.image
}

output "admin_username" {
  description = "providers.admin_username."
  value       = var.admin_username
}

output "ssh_public_key" {
  description = "providers.ssh_public_key (a public key)."
  value       = var.ssh_public_key
}

output "eviction_policy" {
  description = "providers.eviction_policy: Delete or Deallocate."
  value       = var.eviction_policy
}

output "max_price_usd" {
  description = "providers.max_price_usd: -1 pays up to the on-demand price."
  value       = var.max_price_usd
}

output "vm_sizes" {
  description = "providers.vm_sizes: GPU VM sizes offered (empty: the catalog's)."
  value       = var.vm_sizes
}

output "node_identity_id" {
  description = "The nodes' user-assigned identity (blobs under the checkpoint prefix only), for the VMs the control plane creates."
  value       = azurerm_user_assigned_identity.node.id
}

output "node_custom_data" {
  description = "Cloud-init custom data (base64) of Spot VMs: the script that installs and starts spotplane-agent; the control plane puts the node's bootstrap token file ahead of it."
  value       = base64encode(local.node_boot_script)
}

output "node_boot_script" {
  description = "The same node boot script, as text."
  value       = local.node_boot_script
}

output "control_plane_url" {
  description = "The URL agents (--control-plane) and API clients in the virtual network use."
  value       = local.control_plane_url
}

output "control_plane_identity_client_id" {
  description = "Client id of the control plane's user-assigned identity."
  value       = azurerm_user_assigned_identity.control_plane.client_id
}

output "config_toml" {
  description = "The spotplane.toml the control plane runs with (no secrets; DATABASE_URL comes from Key Vault)."
  value       = local.config_toml
}
