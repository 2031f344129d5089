# Service accounts. The control plane gets a custom role holding exactly the Compute Engine
# permissions of the calls providers/src/gcp makes (instances insert/get/list/delete, waiting on
# zone operations): roles/compute.instanceAdmin.v1 would add hundreds more. It may act as the
# node service account only; it reads its own secrets and the checkpoint bucket. Nodes reach
# their checkpoint prefix and nothing else.

resource "google_service_account" "control_plane" {
  project      = var.project
  account_id   = "${var.name}-cp"
  display_name = "spotplane control plane (${var.name})"
  description  = "Runs the spotplane control plane on Cloud Run: buys and deletes Spot GPU VMs, reads its secrets and the checkpoint bucket."
}

resource "google_service_account" "node" {
  project      = var.project
  account_id   = "${var.name}-node"
  display_name = "spotplane GPU nodes (${var.name})"
  description  = "GPU nodes run as this: read and write checkpoints under ${var.checkpoint_prefix}, nothing else."
}

resource "google_project_iam_custom_role" "control_plane" {
  project     = var.project
  role_id     = "spotplane_${replace(var.name, "-", "_")}_control_plane"
  title       = "spotplane control plane (${var.name})"
  description = "The Compute Engine calls of spotplane's GCP provider: insert, get, list and delete instances; wait on zone operations."
  permissions = [
    "compute.instances.create",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.delete",
    # instances.insert with labels, the startup script, a service account and a boot disk
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setServiceAccount",
    "compute.disks.create",
    "compute.images.useReadOnly",
    # the node's interface: the subnetwork, with the external address the provider asks for
    "compute.subnetworks.use",
    "compute.subnetworks.useExternalIp",
    "compute.zoneOperations.get",
  ]
}

resource "google_project_iam_member" "control_plane" {
  project = var.project
  role    = google_project_iam_custom_role.control_plane.name
  member  = "serviceAccount:${google_service_account.control_plane.email}"
}

# iam.serviceAccounts.actAs on the node service account alone, so a VM it creates can run as that.
resource "google_service_account_iam_member" "control_plane_acts_as_node" {
  service_account_id = google_service_account.node.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.control_plane.email}"
}

resource "google_secret_manager_secret_iam_member" "control_plane" {
  for_each = {
    database-url          = google_secret_manager_secret.database_url.secret_id
    bootstrap-admin-token = google_secret_manager_secret.bootstrap_admin_token.secret_id
    config                = google_secret_manager_secret.config.secret_id
    secrets-key           = google_secret_manager_secret.secrets_key.secret_id
  }

  project   = var.project
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.control_plane.email}"
}

resource "google_storage_bucket_iam_member" "control_plane" {
  bucket = google_storage_bucket.checkpoints.name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.control_plane.email}"
}

# Nodes: objects under the checkpoint prefix; listing is checked on the bucket itself.
resource "google_storage_bucket_iam_member" "node" {
  bucket = google_storage_bucket.checkpoints.name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.node.email}"

  condition {
    title       = "checkpoint-prefix-only"
    description = "Objects under ${var.checkpoint_prefix} (and listing the bucket)"
    expression  = "resource.type == \"storage.googleapis.com/Bucket\" || resource.name.startsWith(\"projects/_/buckets/${local.bucket}/objects/${var.checkpoint_prefix}\")"
  }
}
