variable "name" {
  type        = string
  description = "Cluster name: the value of the spotplane-cluster tag on everything, and the prefix of resource names."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,18}[a-z0-9]$", var.name))
    error_message = "The name must be 3-20 characters of lowercase letters, digits and hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource (spotplane-cluster is always added, set to var.name)."
  default     = {}

  validation {
    condition     = !contains(keys(var.tags), "spotplane-cluster")
    error_message = "Do not set spotplane-cluster in tags: the module sets it to var.name."
  }
}

variable "location" {
  type        = string
  description = "Azure location of everything: the control plane, the database, the storage account and the nodes' virtual network (providers.locations)."

  validation {
    condition     = can(regex("^[a-z][a-z0-9]+$", var.location))
    error_message = "A location name such as eastus or westeurope."
  }
}

variable "address_space" {
  type        = string
  description = "Address space of the virtual network the module creates."
  default     = "10.40.0.0/16"

  validation {
    condition     = can(cidrhost(var.address_space, 0))
    error_message = "A CIDR block."
  }
}

variable "control_plane_subnet_cidr" {
  type        = string
  description = "Subnet of the Container Apps environment (delegated to Microsoft.App/environments; /27 or larger)."
  default     = "10.40.0.0/23"

  validation {
    condition     = can(cidrhost(var.control_plane_subnet_cidr, 0)) && tonumber(split("/", var.control_plane_subnet_cidr)[1]) <= 27
    error_message = "A CIDR block of /27 or larger."
  }
}

variable "database_subnet_cidr" {
  type        = string
  description = "Subnet of the PostgreSQL Flexible Server (delegated to Microsoft.DBforPostgreSQL/flexibleServers)."
  default     = "10.40.2.0/24"

  validation {
    condition     = can(cidrhost(var.database_subnet_cidr, 0)) && tonumber(split("/", var.database_subnet_cidr)[1]) <= 28
    error_message = "A CIDR block of /28 or larger."
  }
}

variable "node_subnet_cidr" {
  type        = string
  description = "Subnet GPU nodes' NICs are created in (providers.subnet_id)."
  default     = "10.40.16.0/20"

  validation {
    condition     = can(cidrhost(var.node_subnet_cidr, 0))
    error_message = "A CIDR block."
  }
}

variable "operator_ip_ranges" {
  type        = list(string)
  description = "Public IP ranges (where Terraform runs) allowed through the Key Vault and storage account firewalls, to write the secrets and create the container."
  default     = []

  validation {
    condition     = alltrue([for c in var.operator_ip_ranges : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "CIDR blocks (not 0.0.0.0/0)."
  }
}

variable "control_plane_image" {
  type        = string
  description = "The spotplane container image (entrypoint: the spotplane binary built with --features clouds), pinned by digest or immutable tag. A private registry needs a registry block added. Build it from the repository's Dockerfile and push it (docker build -t REGISTRY/spotplane:VERSION . && docker push REGISTRY/spotplane:VERSION; docs/building.md, The container image)."

  validation {
    condition     = length(var.control_plane_image) > 0 && !can(regex(":latest$", var.control_plane_image))
    error_message = "Give an image reference pinned to a version or digest (not :latest)."
  }
}

variable "control_plane_cpu" {
  type        = number
  description = "vCPUs of each control plane replica (Consumption profile: 0.25 to 4, memory twice as many GiB)."
  default     = 1

  validation {
    condition     = contains([0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4], var.control_plane_cpu)
    error_message = "One of the Consumption profile's sizes: 0.25 to 2 in steps of 0.25, then 2.5, 3, 3.5, 4."
  }
}

variable "control_plane_replicas" {
  type        = number
  description = "Control plane replicas (kept running: the reconcilers run between requests). One leader runs the reconcilers; two survive the loss of one."
  default     = 2

  validation {
    condition     = var.control_plane_replicas >= 1 && var.control_plane_replicas <= 10 && floor(var.control_plane_replicas) == var.control_plane_replicas
    error_message = "Between 1 and 10."
  }
}

variable "image" {
  type        = string
  description = "Image of GPU nodes (providers.image): publisher:offer:sku:version or an image resource id, with NVIDIA drivers and, unless agent_url is set, /usr/local/bin/spotplane-agent."
  default     = "microsoft-dsvm:ubuntu-hpc:2204:latest"

  validation {
    condition     = can(regex("^([^:/\\s]+:[^:/\\s]+:[^:/\\s]+:[^:/\\s]+|/subscriptions/.+)$", var.image))
    error_message = "The image must be publisher:offer:sku:version or an image resource id (/subscriptions/...)."
  }
}

variable "admin_username" {
  type        = string
  description = "Login of nodes (providers.admin_username); SSH key only."
  default     = "spotplane"

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.admin_username)) && !contains(["root", "admin", "administrator"], var.admin_username)
    error_message = "A Linux user name, not root/admin/administrator."
  }
}

variable "ssh_public_key" {
  type        = string
  description = "The public key allowed to log in to nodes (providers.ssh_public_key). Azure needs one: password login is off."

  validation {
    condition     = can(regex("^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+( .*)?$", var.ssh_public_key))
    error_message = "An OpenSSH public key (ssh-ed25519, ssh-rsa or ecdsa-sha2-*)."
  }
}

variable "eviction_policy" {
  type        = string
  description = "What Azure does with an evicted Spot VM (providers.eviction_policy): Delete or Deallocate."
  default     = "Delete"

  validation {
    condition     = contains(["Delete", "Deallocate"], var.eviction_policy)
    error_message = "Delete or Deallocate."
  }
}

variable "max_price_usd" {
  type        = number
  description = "The most to pay per node-hour in US dollars (providers.max_price_usd); -1 pays up to the on-demand price and is evicted only for capacity."
  default     = -1

  validation {
    condition     = var.max_price_usd == -1 || var.max_price_usd > 0
    error_message = "A positive price, or -1."
  }
}

variable "vm_sizes" {
  type        = list(string)
  description = "GPU VM sizes to offer (providers.vm_sizes); empty offers every GPU size of the catalog."
  default     = []

  validation {
    condition     = alltrue([for s in var.vm_sizes : can(regex("^Standard_[A-Za-z0-9_]+$", s))])
    error_message = "VM sizes look like Standard_NC24ads_A100_v4."
  }
}

variable "db_sku" {
  type        = string
  description = "SKU of the PostgreSQL Flexible Server (high availability needs General Purpose or Memory Optimized)."
  default     = "GP_Standard_D2ds_v5"

  validation {
    condition     = can(regex("^(B|GP|MO)_Standard_[A-Za-z0-9_]+$", var.db_sku))
    error_message = "A Flexible Server SKU such as GP_Standard_D2ds_v5 or B_Standard_B2s."
  }
}

variable "db_version" {
  type        = string
  description = "PostgreSQL major version."
  default     = "16"

  validation {
    condition     = contains(["14", "15", "16"], var.db_version)
    error_message = "The version must be 14, 15 or 16."
  }
}

variable "db_storage_mb" {
  type        = number
  description = "Database storage in MiB (grows automatically)."
  default     = 32768

  validation {
    condition     = contains([32768, 65536, 131072, 262144, 524288, 1048576, 2097152, 4193280, 4194304, 8388608, 16777216, 33553408], var.db_storage_mb)
    error_message = "One of Flexible Server's storage sizes (32768, 65536, 131072, ... MiB)."
  }
}

variable "db_high_availability" {
  type        = string
  description = "Standby server: ZoneRedundant, SameZone, or Disabled (Burstable SKUs support none)."
  default     = "ZoneRedundant"

  validation {
    condition     = contains(["ZoneRedundant", "SameZone", "Disabled"], var.db_high_availability)
    error_message = "ZoneRedundant, SameZone or Disabled."
  }
}

variable "db_backup_retention_days" {
  type        = number
  description = "Days of backups and point-in-time restore."
  default     = 14

  validation {
    condition     = var.db_backup_retention_days >= 7 && var.db_backup_retention_days <= 35
    error_message = "Between 7 and 35 days."
  }
}

variable "storage_replication_type" {
  type        = string
  description = "Replication of the checkpoint storage account: ZRS survives a zone loss; GZRS also copies to the paired region."
  default     = "ZRS"

  validation {
    condition     = contains(["LRS", "ZRS", "GRS", "GZRS", "RAGRS", "RAGZRS"], var.storage_replication_type)
    error_message = "LRS, ZRS, GRS, GZRS, RAGRS or RAGZRS."
  }
}

variable "checkpoint_prefix" {
  type        = string
  description = "Blob prefix of checkpoints in the container; the nodes' identity reaches only this prefix."
  default     = "checkpoints/"

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*/$", var.checkpoint_prefix))
    error_message = "A relative prefix ending in /, e.g. checkpoints/."
  }
}

variable "checkpoint_retention_days" {
  type        = number
  description = "Checkpoints not modified for this many days are deleted; 0 keeps them until spotplane deletes them."
  default     = 30

  validation {
    condition     = var.checkpoint_retention_days >= 0 && floor(var.checkpoint_retention_days) == var.checkpoint_retention_days
    error_message = "A whole number of days, 0 to keep."
  }
}

variable "noncurrent_retention_days" {
  type        = number
  description = "Days previous blob versions and deleted blobs are kept."
  default     = 7

  validation {
    condition     = var.noncurrent_retention_days >= 1 && var.noncurrent_retention_days <= 365
    error_message = "Between 1 and 365 days."
  }
}

variable "log_retention_days" {
  type        = number
  description = "Retention of the control plane's logs in Log Analytics."
  default     = 90

  validation {
    condition     = var.log_retention_days >= 30 && var.log_retention_days <= 730
    error_message = "Between 30 and 730 days."
  }
}

variable "agent_work_dir" {
  type        = string
  description = "The agent's --work-dir on nodes."
  default     = "/var/lib/spotplane"

  validation {
    condition     = can(regex("^/[A-Za-z0-9._/-]+$", var.agent_work_dir))
    error_message = "An absolute path."
  }
}

variable "agent_url" {
  type        = string
  description = "HTTPS URL the node boot script downloads spotplane-agent from; empty when the image already has /usr/local/bin/spotplane-agent."
  default     = ""

  validation {
    condition     = var.agent_url == "" || can(regex("^https://[^'\\s]+$", var.agent_url))
    error_message = "An https:// URL without quotes or spaces, or empty."
  }
}

variable "agent_sha256" {
  type        = string
  description = "SHA-256 (hex) of the agent binary at agent_url; the boot script refuses any other file. Required with agent_url. scripts/release-agent prints it (and agent_url's file name)."
  default     = ""

  validation {
    condition     = var.agent_sha256 == "" || can(regex("^[0-9a-f]{64}$", var.agent_sha256))
    error_message = "The agent_sha256 must be 64 lowercase hex digits, or empty."
  }
}
