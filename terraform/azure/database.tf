# PostgreSQL (database.url): Flexible Server in its delegated subnet (no public access), with a
# private DNS zone. The URL, password included, lives in Key Vault; the module outputs only the
# secret's id.

resource "azurerm_private_dns_zone" "postgres" {
  name                = "${var.name}.private.postgres.database.azure.com"
  resource_group_name = azurerm_resource_group.control.name
  tags                = local.tags
}

resource "azurerm_private_dns_zone_virtual_network_link" "postgres" {
  name                 = "${var.name}-postgres"
  private_dns_zone_id  = azurerm_private_dns_zone.postgres.id
  virtual_network_id   = azurerm_virtual_network.this.id
  registration_enabled = false
  tags                 = local.tags
}

resource "random_password" "db" {
  length  = 40
  special = false
}

resource "azurerm_postgresql_flexible_server" "this" {
  #checkov:skip=CKV2_AZURE_57:The server is VNet-integrated (a delegated subnet, public access off), which is private networking without an endpoint; Flexible Server cannot have both.
  name                          = "${var.name}-db-${random_id.suffix.hex}"
  resource_group_name           = azurerm_resource_group.control.name
  location                      = var.location
  version                       = var.db_version
  sku_name                      = var.db_sku
  storage_mb                    = var.db_storage_mb
  auto_grow_enabled             = true
  delegated_subnet_id           = azurerm_subnet.database.id
  private_dns_zone_id           = azurerm_private_dns_zone.postgres.id
  public_network_access_enabled = false
  administrator_login           = "spotplane"
  administrator_password        = random_password.db.result
  backup_retention_days         = var.db_backup_retention_days
  geo_redundant_backup_enabled  = true
  tags                          = local.tags

  authentication {
    password_auth_enabled         = true
    active_directory_auth_enabled = false
  }

  dynamic "high_availability" {
    for_each = var.db_high_availability == "Disabled" ? [] : [var.db_high_availability]
    content {
      mode = high_availability.value
    }
  }

  maintenance_window {
    day_of_week  = 0
    start_hour   = 4
    start_minute = 0
  }

  lifecycle {
    # Azure picks the zones and swaps them on failover.
    ignore_changes = [zone, high_availability[0].standby_availability_zone]
  }

  depends_on = [azurerm_private_dns_zone_virtual_network_link.postgres]
}

resource "azurerm_postgresql_flexible_server_database" "spotplane" {
  name      = "spotplane"
  server_id = azurerm_postgresql_flexible_server.this.id
  charset   = "UTF8"
  collation = "en_US.utf8"
}

resource "azurerm_postgresql_flexible_server_configuration" "this" {
  for_each = {
    require_secure_transport = "on"
    log_checkpoints          = "on"
    log_connections          = "on"
    log_disconnections       = "on"
    connection_throttling    = "on"
  }

  server_id = azurerm_postgresql_flexible_server.this.id
  name      = each.key
  value     = each.value
}
