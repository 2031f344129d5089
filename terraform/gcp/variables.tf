variable "name" {
  type        = string
  description = "Cluster name: the value of the spotplane-cluster label on everything, and the prefix of resource names."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,18}[a-z0-9]$", var.name))
    error_message = "The name must be 3-20 characters of lowercase letters, digits and hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "labels" {
  type        = map(string)
  description = "Labels added to every resource that takes labels (spotplane-cluster is always added, set to var.name)."
  default     = {}

  validation {
    condition     = !contains(keys(var.labels), "spotplane-cluster") && alltrue([for k, v in var.labels : can(regex("^[a-z][a-z0-9_-]{0,62}$", k)) && can(regex("^[a-z0-9_-]{0,63}$", v))])
    error_message = "Labels follow GCP's rules (lowercase keys starting with a letter; values of lowercase letters, digits, _ and -), and spotplane-cluster is set by the module."
  }
}

variable "project" {
  type        = string
  description = "The GCP project everything is created in and nodes are bought in."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "A project id: 6-30 lowercase letters, digits and hyphens."
  }
}

variable "region" {
  type        = string
  description = "Region of the control plane (Cloud Run), the database (Cloud SQL) and the secrets' primary location."

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]$", var.region))
    error_message = "A region such as us-central1."
  }
}

variable "zones" {
  type        = list(string)
  description = "Zones GPU nodes are bought in (providers.zones)."

  validation {
    condition     = length(var.zones) > 0 && alltrue([for z in var.zones : can(regex("^[a-z]+-[a-z]+[0-9]-[a-z]$", z))])
    error_message = "At least one zone, such as us-central1-a."
  }
}

variable "network" {
  type        = string
  description = "Name of the VPC network: Cloud SQL's private IP, the control plane's egress and the nodes use it."

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.network))
    error_message = "A network name (not a self link)."
  }
}

variable "subnetwork" {
  type        = string
  description = "Name of the subnetwork nodes and the control plane's Direct VPC egress use; for zones in other regions, a subnetwork of the same name must exist there. Enable Private Google Access on it."

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.subnetwork))
    error_message = "A subnetwork name (not a self link)."
  }
}

variable "create_private_service_access" {
  type        = bool
  description = "Reserve a range and peer the network with Google's services for Cloud SQL's private IP; false where the network already has private services access."
  default     = true
}

variable "private_service_access_prefix_length" {
  type        = number
  description = "Size of the range reserved for private services access (a /20 by default)."
  default     = 20

  validation {
    condition     = var.private_service_access_prefix_length >= 8 && var.private_service_access_prefix_length <= 24
    error_message = "Between 8 and 24."
  }
}

variable "enable_apis" {
  type        = bool
  description = "Enable the APIs spotplane uses (Compute, Cloud SQL Admin, Cloud Run, Secret Manager, Service Networking, Cloud Billing). They are never disabled on destroy."
  default     = true
}

variable "control_plane_image" {
  type        = string
  description = "The spotplane container image (entrypoint: the spotplane binary built with --features clouds) in Artifact Registry, pinned by digest or immutable tag. Build it from the repository's Dockerfile and push it (docker build -t REGISTRY/spotplane:VERSION . && docker push REGISTRY/spotplane:VERSION; docs/building.md, The container image)."

  validation {
    condition     = length(var.control_plane_image) > 0 && !can(regex(":latest$", var.control_plane_image))
    error_message = "Give an image reference pinned to a version or digest (not :latest)."
  }
}

variable "control_plane_cpu" {
  type        = string
  description = "vCPUs of each control plane instance (Cloud Run limit)."
  default     = "1"

  validation {
    condition     = contains(["1", "2", "4", "6", "8"], var.control_plane_cpu)
    error_message = "One of 1, 2, 4, 6, 8."
  }
}

variable "control_plane_memory" {
  type        = string
  description = "Memory of each control plane instance (Cloud Run limit), e.g. 2Gi."
  default     = "2Gi"

  validation {
    condition     = can(regex("^[0-9]+(Mi|Gi)$", var.control_plane_memory))
    error_message = "A quantity such as 512Mi or 2Gi."
  }
}

variable "control_plane_replicas" {
  type        = number
  description = "Control plane instances kept running (always-allocated CPU: the reconcilers run between requests). One leader runs the reconcilers; two survive the loss of one."
  default     = 2

  validation {
    condition     = var.control_plane_replicas >= 1 && var.control_plane_replicas <= 10 && floor(var.control_plane_replicas) == var.control_plane_replicas
    error_message = "Between 1 and 10."
  }
}

variable "source_image" {
  type        = string
  description = "Boot image of GPU nodes (providers.source_image): NVIDIA drivers and, unless agent_url is set, /usr/local/bin/spotplane-agent."
  default     = "projects/deeplearning-platform-release/global/images/family/common-cu124"

  validation {
    condition     = can(regex("^(projects/[a-z0-9-]+/global/images/|https://www.googleapis.com/compute/v1/projects/[a-z0-9-]+/global/images/).+$", var.source_image))
    error_message = "An image or image family path: projects/PROJECT/global/images/(family/)NAME."
  }
}

variable "boot_disk_gb" {
  type        = number
  description = "Boot disk of GPU nodes in GB (providers.boot_disk_gb)."
  default     = 200

  validation {
    condition     = var.boot_disk_gb >= 50 && var.boot_disk_gb <= 65536
    error_message = "Between 50 and 65536 GB."
  }
}

variable "termination_action" {
  type        = string
  description = "What GCE does with a preempted Spot VM (providers.termination_action): DELETE or STOP."
  default     = "DELETE"

  validation {
    condition     = contains(["DELETE", "STOP"], var.termination_action)
    error_message = "DELETE or STOP."
  }
}

variable "machine_types" {
  type        = list(string)
  description = "GPU machine types to offer (providers.machine_types); empty offers every GPU type of the catalog."
  default     = []

  validation {
    condition     = alltrue([for t in var.machine_types : can(regex("^[a-z][a-z0-9]*-[a-z0-9-]+$", t))])
    error_message = "Machine types look like a2-highgpu-1g or g2-standard-8."
  }
}

variable "node_machine_type" {
  type        = string
  description = "Machine type of the module's node instance template (the control plane chooses per offer). An A2, A3 or G2 type, which include their GPUs."
  default     = "g2-standard-8"

  validation {
    condition     = can(regex("^(a2|a3|g2)-[a-z0-9-]+$", var.node_machine_type))
    error_message = "An A2, A3 or G2 machine type (N1 types need accelerators attached separately)."
  }
}

variable "node_secure_boot" {
  type        = bool
  description = "Shielded VM Secure Boot on nodes. Off by default: the NVIDIA kernel modules of most GPU images are not signed for it."
  default     = false
}

variable "db_tier" {
  type        = string
  description = "Cloud SQL machine tier."
  default     = "db-custom-1-3840"

  validation {
    condition     = can(regex("^db-(custom-[0-9]+-[0-9]+|perf-optimized-N-[0-9]+|g1-small|f1-micro)$", var.db_tier))
    error_message = "A Cloud SQL tier such as db-custom-1-3840."
  }
}

variable "db_version" {
  type        = string
  description = "Cloud SQL PostgreSQL version."
  default     = "POSTGRES_16"

  validation {
    condition     = can(regex("^POSTGRES_1[4-9]$", var.db_version))
    error_message = "POSTGRES_14 or newer."
  }
}

variable "db_availability_type" {
  type        = string
  description = "REGIONAL (a standby in a second zone, about twice the price) or ZONAL."
  default     = "REGIONAL"

  validation {
    condition     = contains(["REGIONAL", "ZONAL"], var.db_availability_type)
    error_message = "REGIONAL or ZONAL."
  }
}

variable "db_disk_size_gb" {
  type        = number
  description = "Initial database disk in GB (grows automatically)."
  default     = 20

  validation {
    condition     = var.db_disk_size_gb >= 10 && var.db_disk_size_gb <= 65536
    error_message = "Between 10 and 65536 GB."
  }
}

variable "db_backup_retention_count" {
  type        = number
  description = "Daily backups kept (point-in-time recovery covers the last 7 days)."
  default     = 14

  validation {
    condition     = var.db_backup_retention_count >= 7 && var.db_backup_retention_count <= 365
    error_message = "Between 7 and 365."
  }
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the database from deletion (turn off only to tear the cluster down)."
  default     = true
}

variable "bucket_location" {
  type        = string
  description = "Location of the checkpoint bucket; empty for the region. A multi-region (US, EU) suits zones in several regions."
  default     = ""

  validation {
    condition     = var.bucket_location == "" || can(regex("^[A-Za-z0-9-]+$", var.bucket_location))
    error_message = "A GCS location such as us-central1, US or EU, or empty."
  }
}

variable "checkpoint_prefix" {
  type        = string
  description = "Object prefix of checkpoints in the bucket; the nodes' service account reaches only this prefix."
  default     = "checkpoints/"

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*/$", var.checkpoint_prefix))
    error_message = "A relative prefix ending in /, e.g. checkpoints/."
  }
}

variable "checkpoint_retention_days" {
  type        = number
  description = "Checkpoints older than this are deleted (kept noncurrent_retention_days more as old versions); 0 keeps them until spotplane deletes them."
  default     = 30

  validation {
    condition     = var.checkpoint_retention_days >= 0 && floor(var.checkpoint_retention_days) == var.checkpoint_retention_days
    error_message = "A whole number of days, 0 to keep."
  }
}

variable "noncurrent_retention_days" {
  type        = number
  description = "Days overwritten or deleted object versions are kept."
  default     = 7

  validation {
    condition     = var.noncurrent_retention_days >= 1 && var.noncurrent_retention_days <= 365
    error_message = "Between 1 and 365 days."
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
