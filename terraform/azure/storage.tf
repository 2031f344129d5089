# The checkpoint storage account and container (object_store.url): Entra ID only (no shared
# keys), TLS 1.2, no public blobs, a firewall admitting the control plane's and the nodes'
# subnets, versioning and soft delete, old checkpoints and old versions expired.

resource "azurerm_storage_account" "checkpoints" {
  #checkov:skip=CKV2_AZURE_1:Encrypted at rest with Microsoft-managed keys (and infrastructure encryption); customer-managed keys would add a Key Vault key and an identity the account depends on, for no control spotplane uses.
  #checkov:skip=CKV2_AZURE_33:Reached through service endpoints from the control plane's and nodes' subnets; the firewall denies everything else.
  #checkov:skip=CKV_AZURE_206:Checkpoints are working state a job can recreate; ZRS survives a zone loss, and storage_replication_type = GZRS adds the paired region where wanted.
  #checkov:skip=CKV_AZURE_59:Public network access is limited to the selected networks: the firewall denies by default and admits the control plane's and nodes' subnets (service endpoints) and operator_ip_ranges; "disabled" would allow private endpoints only.
  #checkov:skip=CKV_AZURE_33:Only the blob service is used; queue logging would configure a service that holds nothing (and needs shared-key access, which is off).
  name                              = local.storage_account
  resource_group_name               = azurerm_resource_group.control.name
  location                          = var.location
  account_kind                      = "StorageV2"
  account_tier                      = "Standard"
  account_replication_type          = var.storage_replication_type
  min_tls_version                   = "TLS1_2"
  https_traffic_only_enabled        = true
  allow_nested_items_to_be_public   = false
  shared_access_key_enabled         = false
  default_to_oauth_authentication   = true
  infrastructure_encryption_enabled = true
  cross_tenant_replication_enabled  = false
  public_network_access_enabled     = true
  tags                              = local.tags

  network_rules {
    default_action             = "Deny"
    bypass                     = ["AzureServices"]
    ip_rules                   = var.operator_ip_ranges
    virtual_network_subnet_ids = [azurerm_subnet.control_plane.id, azurerm_subnet.nodes.id]
  }

  blob_properties {
    versioning_enabled = true

    delete_retention_policy {
      days = var.noncurrent_retention_days
    }

    container_delete_retention_policy {
      days = var.noncurrent_retention_days
    }
  }

  sas_policy {
    expiration_period = "01.00:00:00"
    expiration_action = "Log"
  }
}

# Whoever runs Terraform creates the container (a data-plane call, with Entra ID).
resource "azurerm_role_assignment" "operator_creates_container" {
  scope                = azurerm_storage_account.checkpoints.id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = data.azurerm_client_config.current.object_id
}

resource "azurerm_storage_container" "checkpoints" {
  #checkov:skip=CKV2_AZURE_21:Blob reads, writes and deletes are logged to Log Analytics by the diagnostic setting below; the Storage Insights resource this check looks for needs the account key, and shared keys are off.
  name                  = local.container
  storage_account_id    = azurerm_storage_account.checkpoints.id
  container_access_type = "private"

  depends_on = [azurerm_role_assignment.operator_creates_container]
}

resource "azurerm_storage_management_policy" "checkpoints" {
  storage_account_id = azurerm_storage_account.checkpoints.id

  rule {
    name    = "old-checkpoints"
    enabled = true

    filters {
      blob_types   = ["blockBlob"]
      prefix_match = ["${local.container}/${var.checkpoint_prefix}"]
    }

    actions {
      dynamic "base_blob" {
        for_each = var.checkpoint_retention_days > 0 ? [var.checkpoint_retention_days] : []
        content {
          delete_after_days_since_modification_greater_than = base_blob.value
        }
      }

      version {
        delete_after_days_since_creation = var.noncurrent_retention_days
      }
    }
  }
}

# Blob reads, writes and deletes, to the control plane's Log Analytics workspace.
resource "azurerm_monitor_diagnostic_setting" "blob" {
  name                       = "${var.name}-blob-access"
  target_resource_id         = "${azurerm_storage_account.checkpoints.id}/blobServices/default"
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category = "StorageRead"
  }

  enabled_log {
    category = "StorageWrite"
  }

  enabled_log {
    category = "StorageDelete"
  }
}
