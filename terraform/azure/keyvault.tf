# Key Vault: DATABASE_URL, the bootstrap admin token and the secrets key. RBAC authorization,
# purge protection, a firewall admitting the control plane's subnet and operator_ip_ranges.
# Container Apps reads the secrets by reference with the control plane's identity.

resource "azurerm_key_vault" "this" {
  #checkov:skip=CKV2_AZURE_32:The vault is reached through a service endpoint from the control plane's subnet, and its firewall denies everything else; a private endpoint would add a private DNS zone and cost for no further isolation here.
  name                          = local.key_vault_name
  location                      = var.location
  resource_group_name           = azurerm_resource_group.control.name
  tenant_id                     = data.azurerm_client_config.current.tenant_id
  sku_name                      = "standard"
  rbac_authorization_enabled    = true
  purge_protection_enabled      = true
  soft_delete_retention_days    = 90
  public_network_access_enabled = true
  tags                          = local.tags

  network_acls {
    default_action             = "Deny"
    bypass                     = "AzureServices"
    ip_rules                   = var.operator_ip_ranges
    virtual_network_subnet_ids = [azurerm_subnet.control_plane.id]
  }
}

# Whoever runs Terraform writes the secrets.
resource "azurerm_role_assignment" "operator_writes_secrets" {
  scope                = azurerm_key_vault.this.id
  role_definition_name = "Key Vault Secrets Officer"
  principal_id         = data.azurerm_client_config.current.object_id
}

resource "azurerm_key_vault_secret" "database_url" {
  #checkov:skip=CKV_AZURE_41:An expiry would stop the control plane from reading DATABASE_URL at its next start; the password is rotated by the documented procedure (docs/deploy.md) instead.
  name         = "database-url"
  key_vault_id = azurerm_key_vault.this.id
  content_type = "text/plain; postgres URL"
  value        = "postgres://spotplane:${random_password.db.result}@${azurerm_postgresql_flexible_server.this.fqdn}:5432/spotplane?sslmode=require"
  tags         = local.tags

  depends_on = [azurerm_role_assignment.operator_writes_secrets]
}

resource "random_password" "bootstrap_admin_token" {
  length  = 64
  special = false
}

resource "azurerm_key_vault_secret" "bootstrap_admin_token" {
  #checkov:skip=CKV_AZURE_41:Read once, at the first start, to create the first admin token; revoke that token after creating personal ones (docs/deploy.md).
  name         = "bootstrap-admin-token"
  key_vault_id = azurerm_key_vault.this.id
  content_type = "text/plain; spotplane admin token"
  value        = random_password.bootstrap_admin_token.result
  tags         = local.tags

  depends_on = [azurerm_role_assignment.operator_writes_secrets]
}

# SPOTPLANE_SECRETS__KEY: the key team secrets are encrypted with in the database. Every
# replica gets the same one (container apps have no lasting disk); losing it loses every team
# secret (docs/deploy.md).
resource "random_bytes" "secrets_key" {
  length = 32
}

resource "azurerm_key_vault_secret" "secrets_key" {
  #checkov:skip=CKV_AZURE_41:An expiry would stop the control plane from reading its key at its next start, and a new key leaves every stored team secret unreadable (docs/deploy.md).
  name         = "secrets-key"
  key_vault_id = azurerm_key_vault.this.id
  content_type = "text/plain; base64 key, 32 bytes"
  value        = random_bytes.secrets_key.base64
  tags         = local.tags

  depends_on = [azurerm_role_assignment.operator_writes_secrets]
}
