# spotplane on AWS, end to end: terraform/aws in an existing VPC.
#
#   cp terraform.tfvars.example terraform.tfvars   # then edit
#   terraform init && terraform apply
#
# The state holds the generated database password and bootstrap token (as every Terraform
# state of a database does): keep it in an encrypted, access-controlled backend, e.g.
#
#   terraform {
#     backend "s3" {
#       bucket         = "acme-terraform-state"
#       key            = "spotplane/prod.tfstate"
#       region         = "us-east-1"
#       encrypt        = true
#       dynamodb_table = "terraform-locks"
#     }
#   }

terraform {
  required_version = ">= 1.0.3, < 2.0.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 6.0"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
  }
}

provider "aws" {
  region = var.region
}

variable "region" {
  type        = string
  description = "The AWS region of the cluster."
}

variable "vpc_id" {
  type        = string
  description = "An existing VPC."
}

variable "private_subnet_ids" {
  type        = list(string)
  description = "Private subnets (two zones or more) with a NAT gateway or VPC endpoints."
}

variable "node_subnets" {
  type        = map(string)
  description = "Node subnet per availability zone name."
}

variable "image_id" {
  type        = string
  description = "GPU node AMI."
}

variable "control_plane_image" {
  type        = string
  description = "The spotplane image, pinned: built from the repository's Dockerfile and pushed (docs/building.md)."
}

variable "certificate_arn" {
  type        = string
  description = "ACM certificate for control_plane_hostname."
}

variable "control_plane_hostname" {
  type        = string
  description = "The control plane's DNS name."
}

variable "route53_zone_id" {
  type        = string
  description = "Private hosted zone for control_plane_hostname (empty: manage DNS elsewhere)."
  default     = ""
}

variable "api_allowed_cidrs" {
  type        = list(string)
  description = "Networks allowed to call the API."
  default     = []
}

module "spotplane" {
  source = "../../aws"

  name                   = "prod"
  tags                   = { team = "ml-platform", cost-center = "ml-infra" }
  vpc_id                 = var.vpc_id
  private_subnet_ids     = var.private_subnet_ids
  node_subnets           = var.node_subnets
  image_id               = var.image_id
  instance_types         = ["g6.12xlarge", "p4d.24xlarge", "p5.48xlarge"]
  control_plane_image    = var.control_plane_image
  certificate_arn        = var.certificate_arn
  control_plane_hostname = var.control_plane_hostname
  route53_zone_id        = var.route53_zone_id
  api_allowed_cidrs      = var.api_allowed_cidrs
}

output "control_plane_url" {
  description = "Where agents and API clients reach the control plane."
  value       = module.spotplane.control_plane_url
}

output "database_url_secret" {
  description = "The DATABASE_URL secret (ARN)."
  value       = module.spotplane.database_url_secret
}

output "bootstrap_admin_token_secret" {
  description = "The bootstrap admin token secret (ARN): aws secretsmanager get-secret-value --secret-id <arn>."
  value       = module.spotplane.bootstrap_admin_token_secret
}

output "object_store_url" {
  description = "object_store.url."
  value       = module.spotplane.object_store_url
}

output "interruption_queue_url" {
  description = "providers.interruption_queue_url."
  value       = module.spotplane.interruption_queue_url
}

output "config_toml" {
  description = "The control plane's spotplane.toml: terraform output -raw config_toml."
  value       = module.spotplane.config_toml
}
