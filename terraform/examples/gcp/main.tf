# spotplane on GCP, end to end: terraform/gcp in an existing VPC network.
#
#   cp terraform.tfvars.example terraform.tfvars   # then edit
#   terraform init && terraform apply
#
# The state holds the generated database password and bootstrap token: keep it in an
# access-controlled bucket, e.g.
#
#   terraform {
#     backend "gcs" {
#       bucket = "acme-terraform-state"
#       prefix = "spotplane/prod"
#     }
#   }

terraform {
  required_version = ">= 1.0.3, < 2.0.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 7.0"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
  }
}

provider "google" {
  project = var.project
  region  = var.region
}

variable "project" {
  type        = string
  description = "The GCP project."
}

variable "region" {
  type        = string
  description = "Region of the control plane and the database."
}

variable "zones" {
  type        = list(string)
  description = "Zones GPU nodes are bought in."
}

variable "network" {
  type        = string
  description = "VPC network name."
}

variable "subnetwork" {
  type        = string
  description = "Subnetwork name (Private Google Access on)."
}

variable "control_plane_image" {
  type        = string
  description = "The spotplane image in Artifact Registry, pinned: built from the repository's Dockerfile and pushed (docs/building.md)."
}

module "spotplane" {
  source = "../../gcp"

  name                = "prod"
  labels              = { team = "ml-platform" }
  project             = var.project
  region              = var.region
  zones               = var.zones
  network             = var.network
  subnetwork          = var.subnetwork
  control_plane_image = var.control_plane_image
  machine_types       = ["a2-highgpu-1g", "a3-highgpu-8g", "g2-standard-8"]
}

output "control_plane_url" {
  description = "Where agents and API clients in the VPC reach the control plane."
  value       = module.spotplane.control_plane_url
}

output "database_url_secret" {
  description = "The DATABASE_URL secret (Secret Manager id)."
  value       = module.spotplane.database_url_secret
}

output "bootstrap_admin_token_secret" {
  description = "The bootstrap admin token secret: gcloud secrets versions access latest --secret <name>."
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
