terraform {
  # Terraform 1.0.3 is what the checks run (scripts/test-terraform); nothing here needs newer:
  # no optional() attributes, moved/import blocks, nullable, preconditions or newer functions.
  required_version = ">= 1.0.3, < 2.0.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.60"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
  }
}
