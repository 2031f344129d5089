# spotplane on GCP: Cloud SQL PostgreSQL on a private IP, the checkpoint bucket, service accounts
# for the control plane (a custom role: the Compute Engine calls it makes) and the nodes (their
# checkpoint prefix), the control plane on Cloud Run, and the instance template of Spot GPU
# nodes. docs/deploy.md walks through it.

locals {
  # The control plane's cluster label (providers/src/lib.rs, tags::CLUSTER) goes on everything.
  labels = merge(var.labels, { "spotplane-cluster" = var.name })

  network_id    = "projects/${var.project}/global/networks/${var.network}"
  subnetwork_id = "projects/${var.project}/regions/${var.region}/subnetworks/${var.subnetwork}"

  bucket           = "${var.name}-ckpt-${var.project}"
  object_store_url = "gs://${local.bucket}/${trimsuffix(var.checkpoint_prefix, "/")}"

  token_file = "/etc/spotplane/bootstrap-token"

  node_boot_script = templatefile("${path.module}/../templates/node-boot.sh.tftpl", {
    cloud             = "gcp"
    control_plane_url = google_cloud_run_v2_service.control_plane.uri
    token_file        = local.token_file
    work_dir          = var.agent_work_dir
    agent_url         = var.agent_url
    agent_sha256      = var.agent_sha256
  })

  # What the control plane reads; DATABASE_URL comes from Secret Manager, never from this file.
  config_toml = templatefile("${path.module}/templates/spotplane.toml.tftpl", {
    object_store_url   = local.object_store_url
    project            = var.project
    zones              = var.zones
    source_image       = var.source_image
    boot_disk_gb       = var.boot_disk_gb
    network            = local.network_id
    subnetwork         = var.subnetwork
    service_account    = google_service_account.node.email
    termination_action = var.termination_action
    machine_types      = var.machine_types
  })

  apis = [
    "compute.googleapis.com",
    "sqladmin.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "servicenetworking.googleapis.com",
    "cloudbilling.googleapis.com",
    "iam.googleapis.com",
  ]
}

resource "google_project_service" "this" {
  for_each = var.enable_apis ? toset(local.apis) : toset([])

  project            = var.project
  service            = each.value
  disable_on_destroy = false
}

# --- Private services access (Cloud SQL's private IP) --------------------------------------------

resource "google_compute_global_address" "private_services" {
  count = var.create_private_service_access ? 1 : 0

  project       = var.project
  name          = "${var.name}-private-services"
  purpose       = "VPC_PEERING"
  address_type  = "INTERNAL"
  prefix_length = var.private_service_access_prefix_length
  network       = local.network_id

  depends_on = [google_project_service.this]
}

resource "google_service_networking_connection" "private_services" {
  count = var.create_private_service_access ? 1 : 0

  network                 = local.network_id
  service                 = "servicenetworking.googleapis.com"
  reserved_peering_ranges = [google_compute_global_address.private_services[0].name]
}
