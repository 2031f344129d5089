terraform {
  # Terraform 1.0.3 is what the checks run (scripts/test-terraform), and the pinned provider
  # majors support it (docs/deploy.md, Provider versions); nothing here needs newer: no
  # optional() attributes, moved/import blocks, nullable, preconditions, provider functions,
  # write-only arguments or newer functions.
  required_version = ">= 1.0.3, < 2.0.0"

  # The current majors; the module follows the Google 6.0 and 7.0 upgrade guides.
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
