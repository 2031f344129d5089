terraform {
  # Terraform 1.0.3 is what the checks run (scripts/test-terraform), and the pinned provider
  # majors support it (docs/deploy.md, Provider versions); nothing here needs newer: no
  # optional() attributes, moved/import blocks, nullable, preconditions, provider functions,
  # write-only arguments or newer functions.
  required_version = ">= 1.0.3, < 2.0.0"

  # The current major; the module follows the AWS 6.0 upgrade guide (aws_region: .region).
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
