# The instance template of Spot GPU nodes: provisioning model SPOT with the termination action,
# Shielded VM, no external address, OS Login, the node service account, spotplane-agent started
# from the startup script.

resource "google_compute_instance_template" "node" {
  project      = var.project
  name_prefix  = "${var.name}-gpu-node-"
  description  = "spotplane ${var.name} Spot GPU node: spotplane-agent from the startup script"
  machine_type = var.node_machine_type
  region       = var.region
  labels       = local.labels

  disk {
    source_image = var.source_image
    disk_size_gb = var.boot_disk_gb
    disk_type    = "pd-balanced"
    boot         = true
    auto_delete  = true
    labels       = local.labels
  }

  network_interface {
    subnetwork = local.subnetwork_id
  }

  service_account {
    email  = google_service_account.node.email
    scopes = ["https://www.googleapis.com/auth/devstorage.read_write"]
  }

  scheduling {
    provisioning_model          = "SPOT"
    preemptible                 = true
    automatic_restart           = false
    on_host_maintenance         = "TERMINATE"
    instance_termination_action = var.termination_action
  }

  shielded_instance_config {
    enable_secure_boot          = var.node_secure_boot
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  metadata = {
    startup-script         = local.node_boot_script
    block-project-ssh-keys = "true"
    enable-oslogin         = "TRUE"
    serial-port-enable     = "false"
  }

  lifecycle {
    create_before_destroy = true
  }
}
