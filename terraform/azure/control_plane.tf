# The control plane on Container Apps: an internal environment in the control plane's subnet
# (reachable from the virtual network only), replicas kept running, secrets read from Key Vault
# with the control plane's identity, spotplane.toml mounted as a file.

resource "azurerm_log_analytics_workspace" "this" {
  name                = "${var.name}-logs"
  location            = var.location
  resource_group_name = azurerm_resource_group.control.name
  sku                 = "PerGB2018"
  retention_in_days   = var.log_retention_days
  tags                = local.tags
}

resource "azurerm_container_app_environment" "this" {
  # Provider 5.0 takes log_analytics_workspace_id only with logs_destination = "log-analytics".
  name                           = "${var.name}-env"
  location                       = var.location
  resource_group_name            = azurerm_resource_group.control.name
  logs_destination               = "log-analytics"
  log_analytics_workspace_id     = azurerm_log_analytics_workspace.this.id
  infrastructure_subnet_id       = azurerm_subnet.control_plane.id
  internal_load_balancer_enabled = true
  zone_redundancy_enabled        = true
  tags                           = local.tags

  workload_profile {
    name                  = "Consumption"
    workload_profile_type = "Consumption"
  }
}

# The environment's domain resolves, inside the virtual network, to its internal load balancer.
resource "azurerm_private_dns_zone" "environment" {
  name                = azurerm_container_app_environment.this.default_domain
  resource_group_name = azurerm_resource_group.control.name
  tags                = local.tags
}

resource "azurerm_private_dns_a_record" "environment" {
  name                = "*"
  private_dns_zone_id = azurerm_private_dns_zone.environment.id
  ttl                 = 300
  records             = [azurerm_container_app_environment.this.static_ip_address]
  tags                = local.tags
}

resource "azurerm_private_dns_zone_virtual_network_link" "environment" {
  name                 = "${var.name}-environment"
  private_dns_zone_id  = azurerm_private_dns_zone.environment.id
  virtual_network_id   = azurerm_virtual_network.this.id
  registration_enabled = false
  tags                 = local.tags
}

locals {
  control_plane_url = "https://${azurerm_container_app.control_plane.ingress[0].fqdn}"
}

resource "azurerm_container_app" "control_plane" {
  name                         = "${var.name}-cp"
  resource_group_name          = azurerm_resource_group.control.name
  container_app_environment_id = azurerm_container_app_environment.this.id
  revision_mode                = "Single"
  workload_profile_name        = "Consumption"
  tags                         = local.tags

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.control_plane.id]
  }

  secret {
    name                = "database-url"
    key_vault_secret_id = azurerm_key_vault_secret.database_url.versionless_id
    identity            = azurerm_user_assigned_identity.control_plane.id
  }

  secret {
    name                = "bootstrap-admin-token"
    key_vault_secret_id = azurerm_key_vault_secret.bootstrap_admin_token.versionless_id
    identity            = azurerm_user_assigned_identity.control_plane.id
  }

  secret {
    name                = "secrets-key"
    key_vault_secret_id = azurerm_key_vault_secret.secrets_key.versionless_id
    identity            = azurerm_user_assigned_identity.control_plane.id
  }

  # Not secret: a Container Apps secret only because that is how a file is mounted.
  secret {
    name  = "spotplane-toml"
    value = local.config_toml
  }

  # "External" to the environment, which is itself internal: reachable from the virtual network.
  ingress {
    external_enabled           = true
    target_port                = 8080
    transport                  = "http"
    allow_insecure_connections = false

    traffic_weight {
      latest_revision = true
      percentage      = 100
    }
  }

  template {
    min_replicas = var.control_plane_replicas
    max_replicas = var.control_plane_replicas

    container {
      name   = "spotplane"
      image  = var.control_plane_image
      cpu    = var.control_plane_cpu
      memory = "${var.control_plane_cpu * 2}Gi"
      # The secret volume holds one file per secret, named after it.
      args = ["serve", "--config", "/etc/spotplane/spotplane-toml"]

      env {
        name        = "DATABASE_URL"
        secret_name = "database-url"
      }

      env {
        name        = "SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN"
        secret_name = "bootstrap-admin-token"
      }

      env {
        name        = "SPOTPLANE_SECRETS__KEY"
        secret_name = "secrets-key"
      }

      # Managed identity only (providers/src/azure/credential.rs), as the user-assigned identity.
      env {
        name  = "AZURE_CLIENT_ID"
        value = azurerm_user_assigned_identity.control_plane.client_id
      }

      env {
        name  = "AZURE_TOKEN_CREDENTIALS"
        value = "prod"
      }

      readiness_probe {
        transport = "HTTP"
        port      = 8080
        path      = "/readyz"
      }

      liveness_probe {
        transport = "HTTP"
        port      = 8080
        path      = "/healthz"
      }

      volume_mounts {
        name = "config"
        path = "/etc/spotplane"
      }
    }

    volume {
      name         = "config"
      storage_type = "Secret"
    }
  }

  depends_on = [
    azurerm_role_assignment.control_plane_secrets,
    azurerm_private_dns_zone_virtual_network_link.postgres,
  ]
}
