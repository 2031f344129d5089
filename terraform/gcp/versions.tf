terraform {
  # Terraform 1.0.3 is what the checks run (scripts/test-terraform); nothing here needs newer.
  required_version = ">= 1.0.3, < 2.0.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 5.40"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
  }
}
