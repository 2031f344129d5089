# spotplane on Azure, end to end: terraform/azure creates its own virtual network.
#
#   cp terraform.tfvars.example terraform.tfvars   # then edit
#   terraform init && terraform apply
#
# The state holds the generated database password and bootstrap token: keep it in an
# access-controlled storage account, e.g.
#
#   terraform {
#     backend "azurerm" {
#       resource_group_name  = "terraform-state"
#       storage_account_name = "acmetfstate"
#       container_name       = "tfstate"
#       key                  = "spotplane/prod.tfstate"
#       use_azuread_auth     = true
#     }
#   }

terraform {
  required_version = ">= 1.0.3, < 2.0.0"

  required_providers {
    azurerm = {
      source  = "hashicorp/azurerm"
      version = "~> 5.0"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
  }
}

provider "azurerm" {
  # Required since provider 4.0 (or ARM_SUBSCRIPTION_ID).
  subscription_id = var.subscription_id

  # Since provider 5.0 nothing is registered by default: register the resource providers the
  # module and the control plane use (needs */register/action on the subscription; drop this
  # where they are registered already).
  resource_providers_to_register = [
    "Microsoft.App",
    "Microsoft.Compute",
    "Microsoft.DBforPostgreSQL",
    "Microsoft.Insights",
    "Microsoft.KeyVault",
    "Microsoft.ManagedIdentity",
    "Microsoft.Network",
    "Microsoft.OperationalInsights",
    "Microsoft.Storage",
  ]

  # The storage account has shared keys off: the container is created with Entra ID.
  storage_use_azuread = true

  features {
    key_vault {
      purge_soft_delete_on_destroy = false
    }
  }
}

variable "subscription_id" {
  type        = string
  description = "The Azure subscription (a GUID) the cluster is created in."

  validation {
    condition     = can(regex("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", var.subscription_id))
    error_message = "The subscription_id must be a GUID."
  }
}

variable "location" {
  type        = string
  description = "Azure location."
}

variable "control_plane_image" {
  type        = string
  description = "The spotplane image, pinned: built from the repository's Dockerfile and pushed (docs/building.md)."
}

variable "ssh_public_key" {
  type        = string
  description = "Public key for node logins."
}

variable "operator_ip_ranges" {
  type        = list(string)
  description = "Where Terraform runs from (Key Vault and storage firewalls)."
}

module "spotplane" {
  source = "../../azure"

  name                = "prod"
  tags                = { team = "ml-platform" }
  location            = var.location
  control_plane_image = var.control_plane_image
  ssh_public_key      = var.ssh_public_key
  operator_ip_ranges  = var.operator_ip_ranges
  vm_sizes            = ["Standard_NC24ads_A100_v4", "Standard_NC40ads_H100_v5"]
}

output "control_plane_url" {
  description = "Where agents and API clients in the virtual network reach the control plane."
  value       = module.spotplane.control_plane_url
}

output "database_url_secret" {
  description = "The DATABASE_URL secret (Key Vault id)."
  value       = module.spotplane.database_url_secret
}

output "bootstrap_admin_token_secret" {
  description = "The bootstrap admin token secret: az keyvault secret show --id <id>."
  value       = module.spotplane.bootstrap_admin_token_secret
}

output "object_store_url" {
  description = "object_store.url."
  value       = module.spotplane.object_store_url
}

output "config_toml" {
  description = "The control plane's spotplane.toml: terraform output -raw config_toml."
  value       = module.spotplane.config_toml
}
