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

variable "vpc_id" {
  type        = string
  description = "The VPC the control plane, its database and the GPU nodes run in."

  validation {
    condition     = can(regex("^vpc-[0-9a-f]{8,17}$", var.vpc_id))
    error_message = "The vpc_id must look like vpc-0123456789abcdef0."
  }
}

variable "private_subnet_ids" {
  type        = list(string)
  description = "Private subnets, in at least two availability zones, for the load balancer, the control plane tasks and the database. They need outbound HTTPS (a NAT gateway or VPC endpoints) to reach the AWS APIs."

  validation {
    condition     = length(var.private_subnet_ids) >= 2 && alltrue([for s in var.private_subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))])
    error_message = "Give at least two subnet ids (subnet-...), in different availability zones."
  }
}

variable "node_subnets" {
  type        = map(string)
  description = "The subnet GPU nodes launch into, per availability zone name of this region (e.g. { \"us-east-1a\" = \"subnet-...\" }); becomes the provider's subnets table."

  validation {
    condition     = length(var.node_subnets) > 0 && alltrue([for az, s in var.node_subnets : can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9][a-z]$", az)) && can(regex("^subnet-[0-9a-f]{8,17}$", s))])
    error_message = "Map availability zone names (us-east-1a) to subnet ids (subnet-...); at least one."
  }
}

variable "image_id" {
  type        = string
  description = "The AMI GPU nodes boot: NVIDIA drivers, the container runtime and, unless agent_url is set, /usr/local/bin/spotplane-agent."

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.image_id))
    error_message = "The image_id must be an AMI id (ami-...)."
  }
}

variable "instance_types" {
  type        = list(string)
  description = "GPU instance types to offer; empty offers every GPU type of the price catalog in the region."
  default     = []

  validation {
    condition     = alltrue([for t in var.instance_types : can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", t))])
    error_message = "Instance types look like g6.12xlarge."
  }
}

variable "launch_api" {
  type        = string
  description = "How the control plane buys nodes: create_fleet (instant, price-capacity-optimized) or run_instances."
  default     = "create_fleet"

  validation {
    condition     = contains(["create_fleet", "run_instances"], var.launch_api)
    error_message = "The launch_api must be create_fleet or run_instances."
  }
}

variable "price_list" {
  type        = bool
  description = "Read on-demand prices from the AWS Price List Query API (pricing:GetProducts); false uses the built-in catalog's."
  default     = true
}

variable "price_list_region" {
  type        = string
  description = "The region whose Price List endpoint the control plane asks (each answers for every region)."
  default     = "us-east-1"

  validation {
    condition     = contains(["us-east-1", "eu-central-1", "ap-south-1"], var.price_list_region)
    error_message = "The Price List Query API is served from us-east-1, eu-central-1 and ap-south-1."
  }
}

variable "control_plane_image" {
  type        = string
  description = "The spotplane container image (entrypoint: the spotplane binary built with --features clouds), pinned by digest or immutable tag. Build it from the repository's Dockerfile and push it (docker build -t REGISTRY/spotplane:VERSION . && docker push REGISTRY/spotplane:VERSION; docs/building.md, The container image)."

  validation {
    condition     = length(var.control_plane_image) > 0 && !can(regex(":latest$", var.control_plane_image))
    error_message = "Give an image reference pinned to a version or digest (not :latest)."
  }
}

variable "config_writer_image" {
  type        = string
  description = "A small image with /bin/sh that writes the rendered spotplane.toml into the task's config volume before the control plane starts."
  default     = "public.ecr.aws/docker/library/busybox:1.36.1"

  validation {
    condition     = length(var.config_writer_image) > 0 && !can(regex(":latest$", var.config_writer_image))
    error_message = "Give an image reference pinned to a version or digest (not :latest)."
  }
}

variable "control_plane_cpu" {
  type        = number
  description = "Fargate CPU units per control plane task (1024 = 1 vCPU)."
  default     = 1024

  validation {
    condition     = contains([256, 512, 1024, 2048, 4096, 8192, 16384], var.control_plane_cpu)
    error_message = "Fargate CPU is one of 256, 512, 1024, 2048, 4096, 8192, 16384."
  }
}

variable "control_plane_memory" {
  type        = number
  description = "Memory (MiB) per control plane task; must be a valid Fargate pairing with control_plane_cpu."
  default     = 2048

  validation {
    condition     = var.control_plane_memory >= 512 && var.control_plane_memory <= 122880 && var.control_plane_memory % 512 == 0
    error_message = "Memory is 512 MiB to 120 GiB in steps of 512 MiB (and must pair with the CPU size)."
  }
}

variable "control_plane_replicas" {
  type        = number
  description = "Control plane tasks. All serve the API; one leader (a PostgreSQL advisory lock) runs the reconcilers. Two survive the loss of one."
  default     = 2

  validation {
    condition     = var.control_plane_replicas >= 1 && var.control_plane_replicas <= 10 && floor(var.control_plane_replicas) == var.control_plane_replicas
    error_message = "Between 1 and 10 replicas."
  }
}

variable "cpu_architecture" {
  type        = string
  description = "CPU architecture of the control plane image: X86_64 or ARM64."
  default     = "X86_64"

  validation {
    condition     = contains(["X86_64", "ARM64"], var.cpu_architecture)
    error_message = "X86_64 or ARM64."
  }
}

variable "certificate_arn" {
  type        = string
  description = "ACM certificate for control_plane_hostname, served by the internal load balancer."

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:acm:[a-z0-9-]+:[0-9]{12}:certificate/.+$", var.certificate_arn))
    error_message = "The certificate_arn must be an ACM certificate ARN."
  }
}

variable "control_plane_hostname" {
  type        = string
  description = "DNS name agents and users reach the control plane at (e.g. spotplane.internal.example.com); the certificate must cover it."

  validation {
    condition     = can(regex("^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\\.)+[a-z]{2,63}$", var.control_plane_hostname))
    error_message = "Give a fully qualified lowercase DNS name."
  }
}

variable "route53_zone_id" {
  type        = string
  description = "Route 53 (private) hosted zone to create control_plane_hostname in; empty to manage DNS elsewhere."
  default     = ""

  validation {
    condition     = var.route53_zone_id == "" || can(regex("^Z[A-Z0-9]{1,31}$", var.route53_zone_id))
    error_message = "A Route 53 hosted zone id (Z...) or empty."
  }
}

variable "api_allowed_cidrs" {
  type        = list(string)
  description = "Networks (VPN, CI) allowed to reach the API on 443, besides the GPU nodes, which always are."
  default     = []

  validation {
    condition     = alltrue([for c in var.api_allowed_cidrs : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "Give CIDR blocks; 0.0.0.0/0 is refused (the load balancer is internal)."
  }
}

variable "db_instance_class" {
  type        = string
  description = "RDS instance class of the PostgreSQL database."
  default     = "db.t4g.small"

  validation {
    condition     = can(regex("^db\\.[a-z0-9]+\\.[a-z0-9]+$", var.db_instance_class))
    error_message = "An RDS instance class such as db.t4g.small or db.m7g.large."
  }
}

variable "db_engine_version" {
  type        = string
  description = "PostgreSQL major version (or major.minor) of the database."
  default     = "16"

  validation {
    condition     = can(regex("^1[4-9](\\.[0-9]+)?$", var.db_engine_version))
    error_message = "PostgreSQL 14 or newer, e.g. 16 or 16.4."
  }
}

variable "db_allocated_storage_gb" {
  type        = number
  description = "Initial storage of the database in GiB (storage autoscaling grows it up to db_max_allocated_storage_gb)."
  default     = 20

  validation {
    condition     = var.db_allocated_storage_gb >= 20 && var.db_allocated_storage_gb <= 65536
    error_message = "Between 20 and 65536 GiB."
  }
}

variable "db_max_allocated_storage_gb" {
  type        = number
  description = "Upper bound of storage autoscaling in GiB."
  default     = 200

  validation {
    condition     = var.db_max_allocated_storage_gb >= 20 && var.db_max_allocated_storage_gb <= 65536
    error_message = "Between 20 and 65536 GiB."
  }
}

variable "db_multi_az" {
  type        = bool
  description = "A standby in a second availability zone (about twice the instance price)."
  default     = true
}

variable "db_backup_retention_days" {
  type        = number
  description = "Days of automated backups and point-in-time recovery."
  default     = 14

  validation {
    condition     = var.db_backup_retention_days >= 7 && var.db_backup_retention_days <= 35
    error_message = "Between 7 and 35 days."
  }
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the database and the load balancer from deletion (turn off only to tear the cluster down)."
  default     = true
}

variable "checkpoint_prefix" {
  type        = string
  description = "Key prefix of checkpoints in the bucket; the nodes' role reaches only this prefix."
  default     = "checkpoints/"

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*/$", var.checkpoint_prefix))
    error_message = "A relative prefix ending in /, e.g. checkpoints/."
  }
}

variable "checkpoint_retention_days" {
  type        = number
  description = "Checkpoints older than this are deleted (their last version kept noncurrent_retention_days more); 0 keeps them until spotplane deletes them."
  default     = 30

  validation {
    condition     = var.checkpoint_retention_days >= 0 && floor(var.checkpoint_retention_days) == var.checkpoint_retention_days
    error_message = "A whole number of days, 0 to keep."
  }
}

variable "noncurrent_retention_days" {
  type        = number
  description = "Days overwritten or deleted object versions are kept (recovery from a bad write)."
  default     = 7

  validation {
    condition     = var.noncurrent_retention_days >= 1 && var.noncurrent_retention_days <= 365
    error_message = "Between 1 and 365 days."
  }
}

variable "interruption_message_retention_seconds" {
  type        = number
  description = "How long an interruption event waits in the queue. A spot warning is worthless after its two minutes; reconciliation catches what was missed."
  default     = 900

  validation {
    condition     = var.interruption_message_retention_seconds >= 60 && var.interruption_message_retention_seconds <= 1209600
    error_message = "Between 60 seconds and 14 days."
  }
}

variable "log_retention_days" {
  type        = number
  description = "Retention of the control plane's and the database's CloudWatch logs."
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "One of CloudWatch Logs' retention periods (1, 3, 5, 7, 14, 30, 60, 90, ..., 365, ..., 3653)."
  }
}

variable "node_root_volume_gb" {
  type        = number
  description = "Root volume of GPU nodes launched from the module's launch template, in GiB."
  default     = 200

  validation {
    condition     = var.node_root_volume_gb >= 30 && var.node_root_volume_gb <= 16384
    error_message = "Between 30 and 16384 GiB."
  }
}

variable "node_root_device_name" {
  type        = string
  description = "Root device name of the node AMI (/dev/sda1 for Ubuntu-based Deep Learning AMIs, /dev/xvda for Amazon Linux)."
  default     = "/dev/sda1"

  validation {
    condition     = can(regex("^/dev/(sd[a-z][0-9]?|xvd[a-z])$", var.node_root_device_name))
    error_message = "A device name such as /dev/sda1 or /dev/xvda."
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
  description = "HTTPS URL the node boot script downloads spotplane-agent from; empty when the AMI already has /usr/local/bin/spotplane-agent."
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

variable "create_spot_service_linked_role" {
  type        = bool
  description = "Create AWSServiceRoleForEC2Spot. EC2 needs it to launch spot instances; leave false where the account already has it (creating it twice fails)."
  default     = false
}
