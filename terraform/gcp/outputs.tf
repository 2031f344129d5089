# What the control plane's configuration needs (config/examples/clouds.toml, the [[providers]]
# table of kind "gcp"), plus references to the secrets. No output holds a secret.

output "database_url_secret" {
  description = "Secret Manager secret holding DATABASE_URL (database.url), as projects/PROJECT/secrets/NAME. A reference, not the value."
  value       = google_secret_manager_secret.database_url.id
}

output "bootstrap_admin_token_secret" {
  description = "Secret Manager secret holding SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN (the first admin token)."
  value       = google_secret_manager_secret.bootstrap_admin_token.id
}

output "object_store_url" {
  description = "object_store.url: where checkpoints go (gs://bucket/prefix)."
  value       = local.object_store_url
}

output "checkpoint_bucket" {
  description = "Name of the checkpoint bucket."
  value       = google_storage_bucket.checkpoints.name
}

output "project" {
  description = "providers.project."
  value       = var.project
}

output "zones" {
  description = "providers.zones: the zones GPU nodes are bought in."
  value       = var.zones
}

output "source_image" {
  description = "providers.source_image: the boot image of nodes."
  value       = var.source_image
}

output "boot_disk_gb" {
  description = "providers.boot_disk_gb."
  value       = var.boot_disk_gb
}

output "network" {
  description = "providers.network: the VPC network (projects/PROJECT/global/networks/NAME)."
  value       = local.network_id
}

output "subnetwork" {
  description = "providers.subnetwork: the subnetwork name (the same name in each region with zones)."
  value       = var.subnetwork
}

output "service_account" {
  description = "providers.service_account: the service account nodes run as; it reaches only the checkpoint prefix."
  value       = google_service_account.node.email
}

output "termination_action" {
  description = "providers.termination_action: DELETE or STOP."
  value       = var.termination_action
}

output "machine_types" {
  description = "providers.machine_types: GPU machine types offered (empty: the catalog's)."
  value       = var.machine_types
}

output "control_plane_service_account" {
  description = "The control plane's service account (its custom role: the Compute Engine calls it makes)."
  value       = google_service_account.control_plane.email
}

output "node_instance_template" {
  description = "The Spot GPU node instance template (self link)."
  value       = google_compute_instance_template.node.self_link
}

output "node_boot_script" {
  description = "The node startup script that installs and starts spotplane-agent; the control plane puts the node's bootstrap token file ahead of it."
  value       = local.node_boot_script
}

output "control_plane_url" {
  description = "The URL agents (--control-plane) and API clients in the VPC use."
  value       = google_cloud_run_v2_service.control_plane.uri
}

output "config_toml" {
  description = "The spotplane.toml the control plane runs with (no secrets; DATABASE_URL comes from the secret)."
  value       = local.config_toml
}
