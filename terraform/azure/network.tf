# The virtual network: the Container Apps environment, the database and the nodes each in their
# own subnet behind a network security group. Storage and Key Vault are reached through service
# endpoints, so their firewalls admit these subnets and deny the internet.

resource "azurerm_virtual_network" "this" {
  name                = "${var.name}-vnet"
  location            = var.location
  resource_group_name = azurerm_resource_group.control.name
  address_space       = [var.address_space]
  tags                = local.tags
}

resource "azurerm_subnet" "control_plane" {
  name                 = "control-plane"
  resource_group_name  = azurerm_resource_group.control.name
  virtual_network_name = azurerm_virtual_network.this.name
  address_prefixes     = [var.control_plane_subnet_cidr]

  service_endpoint {
    service = "Microsoft.Storage"
  }

  service_endpoint {
    service = "Microsoft.KeyVault"
  }

  delegation {
    name = "container-apps"
    service_delegation {
      name    = "Microsoft.App/environments"
      actions = ["Microsoft.Network/virtualNetworks/subnets/join/action"]
    }
  }
}

resource "azurerm_subnet" "database" {
  name                 = "database"
  resource_group_name  = azurerm_resource_group.control.name
  virtual_network_name = azurerm_virtual_network.this.name
  address_prefixes     = [var.database_subnet_cidr]

  delegation {
    name = "postgresql"
    service_delegation {
      name    = "Microsoft.DBforPostgreSQL/flexibleServers"
      actions = ["Microsoft.Network/virtualNetworks/subnets/join/action"]
    }
  }
}

resource "azurerm_subnet" "nodes" {
  name                 = "nodes"
  resource_group_name  = azurerm_resource_group.control.name
  virtual_network_name = azurerm_virtual_network.this.name
  address_prefixes     = [var.node_subnet_cidr]

  service_endpoint {
    service = "Microsoft.Storage"
  }
}

# Azure's default rules allow traffic within the virtual network and deny inbound from the
# internet; these add nothing but an explicit, named place for later rules.
resource "azurerm_network_security_group" "this" {
  for_each = toset(["control-plane", "database", "nodes"])

  name                = "${var.name}-${each.key}"
  location            = var.location
  resource_group_name = azurerm_resource_group.control.name
  tags                = local.tags
}

resource "azurerm_subnet_network_security_group_association" "this" {
  for_each = {
    control-plane = azurerm_subnet.control_plane.id
    database      = azurerm_subnet.database.id
    nodes         = azurerm_subnet.nodes.id
  }

  subnet_id                 = each.value
  network_security_group_id = azurerm_network_security_group.this[each.key].id
}
