"""Static checks of the Terraform modules against the code they deploy.

Run by scripts/test-terraform with python-hcl2 installed and TERRAFORM naming a Terraform 1.0.3
binary (it renders templates and asks which functions exist). No provider plugins are needed.

What is checked, and against what:
- each module outputs every setting of its [[providers]] table that infrastructure decides
  (the fields of AwsConfig / GcpConfig / AzureConfig in providers/src/config.rs), plus the
  database URL secret reference, object_store.url, the control plane URL and the rendered config;
- no output can carry a secret;
- the rendered spotplane.toml is valid TOML whose keys all exist in the Rust config structs
  (they deny unknown fields) and which sets every required field;
- the EventBridge rules match, kind for kind, the (source, detail-type) pairs that
  providers/src/aws/events.rs routes, with the same state and health filters;
- the node boot script starts `spotplane-agent run` with the agreed flags;
- Terraform 1.0.3 compatibility beyond what `terraform providers` already loads: no blocks,
  arguments or functions from later versions;
- the pinned provider majors (aws 6, google 7, azurerm 5): no argument or attribute their
  upgrade guides (AWS 6, Google 6 and 7, AzureRM 4 and 5) removed, and the changes those guides
  required of these modules (region attribute, deletion protection, renamed Azure arguments,
  resource provider registration) in place;
- variables are typed, described and validated; tags/labels carry spotplane-cluster
  (providers/src/lib.rs tags::CLUSTER); every checkov skip gives its reason.
"""

import base64
import glob
import os
import re
import subprocess
import tempfile
import tomllib
import unittest

import hcl2

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TF = os.path.join(ROOT, "terraform")
CLOUDS = ("aws", "gcp", "azure")


# --- reading -----------------------------------------------------------------------------------


def uq(s):
    """python-hcl2 keeps the quotes of string literals and block labels."""
    if isinstance(s, str) and len(s) >= 2 and s[0] == '"' and s[-1] == '"':
        return s[1:-1]
    return s


def load_dir(path):
    """Every .tf file of a directory (not recursive), parsed, merged by block kind."""
    merged = {}
    files = sorted(glob.glob(os.path.join(path, "*.tf")))
    if not files:
        raise AssertionError(f"no .tf files in {path}")
    for f in files:
        with open(f) as fh:
            doc = hcl2.load(fh)
        for kind, blocks in doc.items():
            merged.setdefault(kind, []).extend((f, b) for b in blocks)
    return merged


def outputs(doc):
    return {uq(n): body for _, b in doc.get("output", []) for n, body in b.items()}


def variables(doc):
    return {uq(n): body for _, b in doc.get("variable", []) for n, body in b.items()}


def locals_of(doc):
    out = {}
    for _, b in doc.get("locals", []):
        out.update({k: v for k, v in b.items() if not k.startswith("__")})
    return out


def resources(doc, kind="resource"):
    """(file, type, name, body) of every resource (or data) block."""
    for f, b in doc.get(kind, []):
        for ty, insts in b.items():
            for name, body in insts.items():
                yield f, uq(ty), uq(name), body


def read(path):
    """A file by absolute path or relative to the repository."""
    with open(os.path.join(ROOT, path)) as fh:
        return fh.read()


def rust_struct_fields(src, name):
    """{field: required} of a serde struct; required = no serde default and not an Option."""
    m = re.search(r"pub struct " + name + r" \{(.*?)\n\}", src, re.S)
    if not m:
        raise AssertionError(f"struct {name} not found")
    fields = {}
    attrs = []
    for line in m.group(1).splitlines():
        line = line.strip()
        if line.startswith("#["):
            attrs.append(line)
            continue
        fm = re.match(r"pub (\w+): (.+),$", line)
        if fm:
            defaulted = any("default" in a for a in attrs)
            optional = fm.group(2).startswith("Option<")
            fields[fm.group(1)] = not (defaulted or optional)
            attrs = []
        elif not line.startswith("///"):
            attrs = []
    return fields


# --- what the modules must provide -----------------------------------------------------------

CONFIG_RS = "providers/src/config.rs"
STRUCTS = {"aws": "AwsConfig", "gcp": "GcpConfig", "azure": "AzureConfig"}

# Fields of the provider tables that are not infrastructure: endpoints of test servers and
# emulators, and test-only switches. Every other field must be a module output.
NOT_INFRASTRUCTURE = {
    "aws": {"endpoint_url", "price_list_endpoint_url"},
    "gcp": {"endpoint_url", "billing_endpoint_url", "anonymous_credentials"},
    "azure": {"endpoint_url", "prices_endpoint_url"},
}

# Settings outside the [[providers]] table: database.url (as a secret reference, never the
# value), object_store.url, the first admin token (a reference), where agents connect, the file.
COMMON_OUTPUTS = {
    "database_url_secret",
    "bootstrap_admin_token_secret",
    "object_store_url",
    "control_plane_url",
    "config_toml",
}

# Anything that reads a secret's value. An output referring to one of these leaks it into state
# outputs (and `terraform output`).
SECRET_VALUE = re.compile(
    r"random_password\.|\.secret_string|\.secret_data|administrator_password|"
    r"azurerm_key_vault_secret\.[a-z0-9_]+\.value|\.password\b|\.result\b"
)

# Resource types that take no tags or labels. Any other resource must have them.
UNTAGGABLE = {
    # AWS
    "aws_kms_alias", "aws_s3_bucket_ownership_controls", "aws_s3_bucket_public_access_block",
    "aws_s3_bucket_versioning", "aws_s3_bucket_server_side_encryption_configuration",
    "aws_s3_bucket_lifecycle_configuration", "aws_s3_bucket_logging", "aws_s3_bucket_policy",
    "aws_sqs_queue_policy", "aws_cloudwatch_event_target", "aws_iam_role_policy",
    "aws_iam_role_policy_attachment", "aws_secretsmanager_secret_version", "aws_route53_record",
    # GCP
    "google_project_service", "google_compute_global_address", "google_service_networking_connection",
    "google_sql_database", "google_sql_user", "google_secret_manager_secret_version",
    "google_service_account", "google_project_iam_custom_role", "google_project_iam_member",
    "google_service_account_iam_member", "google_secret_manager_secret_iam_member",
    "google_storage_bucket_iam_member", "google_cloud_run_v2_service_iam_member",
    # Azure
    "azurerm_subnet", "azurerm_subnet_network_security_group_association",
    "azurerm_postgresql_flexible_server_database", "azurerm_postgresql_flexible_server_configuration",
    "azurerm_role_assignment", "azurerm_role_definition", "azurerm_storage_container",
    "azurerm_storage_management_policy", "azurerm_monitor_diagnostic_setting",
    # random
    "random_password", "random_id", "random_bytes",
}
TAG_ARGS = ("tags", "labels", "user_labels", "settings")  # settings: Cloud SQL's user_labels

# The majors the modules are written for (docs/deploy.md, Provider versions). Moving one means
# going through its upgrade guide and extending REMOVED_ARGS / the breaking-change test below.
PROVIDER_PINS = {
    "aws": {"source": "hashicorp/aws", "majors": {"6"}},
    "google": {"source": "hashicorp/google", "majors": {"7"}},
    "azurerm": {"source": "hashicorp/azurerm", "majors": {"5"}},
    "random": {"source": "hashicorp/random", "majors": {"3"}},
}

# Arguments (dotted paths into nested blocks) the provider upgrade guides remove or rename, for
# the resource types the modules use or might plausibly use: AWS 6.0, Google 6.0 and 7.0,
# AzureRM 4.0 and 5.0. A module setting one would fail to plan on the pinned major.
REMOVED_ARGS = {
    # AWS 6.0
    "aws_launch_template": {"elastic_gpu_specifications", "elastic_inference_accelerator"},
    "aws_ecs_task_definition": {"inference_accelerator"},
    "aws_instance": {"cpu_core_count", "cpu_threads_per_core"},
    "aws_spot_instance_request": {"block_duration_minutes"},
    "aws_eip": {"vpc"},
    "aws_flow_log": {"log_group_name"},
    # Google 6.0 / 7.0
    "google_sql_database_instance": {"settings.ip_configuration.require_ssl"},
    "google_storage_bucket": {"lifecycle_rule.condition.no_age"},
    "google_compute_subnetwork": {"enable_flow_logs"},
    "google_project": {"skip_delete"},
    # AzureRM 4.0 / 5.0
    "azurerm_key_vault": {"enable_rbac_authorization", "contact"},
    "azurerm_storage_account": {"enable_https_traffic_only", "queue_properties", "static_website"},
    "azurerm_storage_container": {"storage_account_name"},
    "azurerm_subnet": {
        "service_endpoints", "private_endpoint_network_policies_enabled",
        "enforce_private_link_endpoint_network_policies", "enforce_private_link_service_network_policies",
    },
    "azurerm_virtual_network": {"subnet.service_endpoints"},
    "azurerm_private_dns_a_record": {"zone_name", "resource_group_name"},
    "azurerm_private_dns_zone_virtual_network_link": {"private_dns_zone_name", "resource_group_name"},
    "azurerm_monitor_diagnostic_setting": {"log", "metric", "enabled_log.retention_policy"},
    "azurerm_log_analytics_workspace": {
        "local_authentication_disabled", "internet_ingestion_enabled", "internet_query_enabled",
    },
    "azurerm_container_app": {
        "template.container.liveness_probe.termination_grace_period_seconds",
        "template.container.startup_probe.termination_grace_period_seconds",
    },
}

# Attributes the guides remove or deprecate, as references: TYPE.NAME.ATTR in expressions.
REMOVED_ATTRS = {
    "data.aws_region": {"name", "id"},  # AWS 6.0: use .region
    "aws_s3_bucket": {"region"},  # AWS 6.0: region is now the resource's own; use bucket_region
    "azurerm_storage_container": {"resource_manager_id"},  # AzureRM 5.0: use id
}

# Azure resource providers each resource type needs registered (AzureRM 5.0 registers none by
# default); Microsoft.Compute for the VMs the control plane creates.
AZURE_RESOURCE_PROVIDERS = (
    ("azurerm_container_app", "Microsoft.App"),
    ("azurerm_log_analytics_", "Microsoft.OperationalInsights"),
    ("azurerm_postgresql_flexible_", "Microsoft.DBforPostgreSQL"),
    ("azurerm_key_vault", "Microsoft.KeyVault"),
    ("azurerm_storage_", "Microsoft.Storage"),
    ("azurerm_user_assigned_identity", "Microsoft.ManagedIdentity"),
    ("azurerm_monitor_", "Microsoft.Insights"),
    ("azurerm_private_dns_", "Microsoft.Network"),
    ("azurerm_virtual_network", "Microsoft.Network"),
    ("azurerm_subnet", "Microsoft.Network"),
    ("azurerm_network_security_group", "Microsoft.Network"),
)


def terraform():
    tf = os.environ.get("TERRAFORM")
    if not tf or not os.access(tf, os.X_OK):
        raise AssertionError("set TERRAFORM to a Terraform 1.0.3 binary (scripts/test-terraform does)")
    return tf


def console(expr):
    """Evaluates an expression with `terraform console` in an empty directory."""
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run(
            [terraform(), "console", "-no-color"],
            input=expr + "\n", capture_output=True, text=True, cwd=d, timeout=60,
            env={**os.environ, "TF_DATA_DIR": os.path.join(d, ".terraform"), "CHECKPOINT_DISABLE": "1"},
        )
    return p.returncode, p.stdout, p.stderr


def hcl_value(v):
    """A Python value as an HCL literal."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("${", "$${") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(hcl_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{hcl_value(k)} = {hcl_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def render(template, values):
    """Renders a template file with Terraform's own templatefile()."""
    expr = f"base64encode(templatefile({hcl_value(template)}, {hcl_value(values)}))"
    rc, out, err = console(expr)
    if rc != 0:
        raise AssertionError(f"templatefile({template}) failed:\n{err}")
    return base64.b64decode(out.strip().strip('"')).decode()


SAMPLE_CONFIG_VALUES = {
    "aws": {
        "object_store_url": "s3://b/checkpoints", "regions": ["us-east-1"], "image_id": "ami-0123",
        "launch_api": "create_fleet",
        "interruption_queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/q",
        "instance_types": ["g6.12xlarge"], "security_group_ids": ["sg-1"],
        "instance_profile": "prod-node", "subnets": {"us-east-1a": "subnet-1", "us-east-1b": "subnet-2"},
        "price_list": True, "price_list_region": "us-east-1",
    },
    "gcp": {
        "object_store_url": "gs://b/checkpoints", "project": "p", "zones": ["us-central1-a"],
        "source_image": "projects/x/global/images/family/y", "boot_disk_gb": 200,
        "network": "projects/p/global/networks/n", "subnetwork": "s",
        "service_account": "n@p.iam.gserviceaccount.com", "termination_action": "DELETE",
        "machine_types": [],
    },
    "azure": {
        "object_store_url": "az://a/c/checkpoints", "subscription_id": "0000", "resource_group": "rg",
        "locations": ["eastus"], "subnet_id": "/subscriptions/0000/x/subnets/nodes",
        "image": "a:b:c:latest", "admin_username": "spotplane", "ssh_public_key": "ssh-ed25519 AAAA x",
        "eviction_policy": "Delete", "max_price_usd": "-1.0000", "vm_sizes": [],
    },
}


# --- the checks --------------------------------------------------------------------------------


class Modules(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.docs = {c: load_dir(os.path.join(TF, c)) for c in CLOUDS}
        cls.examples = {c: load_dir(os.path.join(TF, "examples", c)) for c in CLOUDS}
        cls.config_rs = read(CONFIG_RS)

    def test_every_setting_the_control_plane_reads_is_an_output(self):
        for cloud in CLOUDS:
            fields = rust_struct_fields(self.config_rs, STRUCTS[cloud])
            wanted = (set(fields) - NOT_INFRASTRUCTURE[cloud]) | COMMON_OUTPUTS
            stale = NOT_INFRASTRUCTURE[cloud] - set(fields)
            self.assertFalse(stale, f"{cloud}: NOT_INFRASTRUCTURE names fields config.rs no longer has: {stale}")
            missing = wanted - set(outputs(self.docs[cloud]))
            self.assertFalse(missing, f"terraform/{cloud} lacks outputs the control plane reads: {sorted(missing)}")

    def test_outputs_are_described_and_never_secret(self):
        for cloud in CLOUDS:
            for name, body in outputs(self.docs[cloud]).items():
                self.assertTrue(uq(body.get("description", "")), f"{cloud}: output {name} has no description")
                value = str(body.get("value", ""))
                self.assertIsNone(SECRET_VALUE.search(value), f"{cloud}: output {name} reads a secret: {value}")
                if re.search(r"password|token\b|secret_value", name) and not name.endswith("_secret"):
                    self.assertEqual(body.get("sensitive"), True, f"{cloud}: output {name} must be sensitive")

    def test_rendered_config_is_valid_toml_with_known_keys(self):
        cp = read("control-plane/src/config.rs")
        sections = {
            "server": rust_struct_fields(cp, "ServerConfig"),
            "object_store": rust_struct_fields(cp, "ObjectStoreConfig"),
            "log": rust_struct_fields(cp, "LogConfig"),
        }
        for cloud in CLOUDS:
            text = render(os.path.join(TF, cloud, "templates", "spotplane.toml.tftpl"), SAMPLE_CONFIG_VALUES[cloud])
            doc = tomllib.loads(text)
            for section, keys in doc.items():
                if section == "providers":
                    continue
                self.assertIn(section, sections, f"{cloud}: unexpected [{section}]")
                unknown = set(keys) - set(sections[section])
                self.assertFalse(unknown, f"{cloud}: [{section}] keys unknown to the control plane: {unknown}")
            self.assertIn("url", doc["object_store"])
            self.assertNotIn("database", doc, f"{cloud}: the database URL must come from the secret, not the file")
            (prov,) = doc["providers"]
            self.assertEqual(prov.pop("kind"), cloud)
            fields = rust_struct_fields(self.config_rs, STRUCTS[cloud])
            unknown = set(prov) - set(fields)
            self.assertFalse(unknown, f"{cloud}: provider keys config.rs refuses (deny_unknown_fields): {unknown}")
            required = {f for f, req in fields.items() if req}
            self.assertFalse(required - set(prov), f"{cloud}: required provider keys missing: {required - set(prov)}")
            # The sample values are exactly the template's variables (loop variables aside).
            tpl = read(f"terraform/{cloud}/templates/spotplane.toml.tftpl")
            loops = re.findall(r"%\{ for (\w+), (\w+) in ([a-z_]+)", tpl)
            tpl_vars = set(re.findall(r"\$\{(?:jsonencode\()?([a-z_]+)", tpl)) | {l[2] for l in loops}
            tpl_vars -= {v for l in loops for v in l[:2]}
            self.assertEqual(tpl_vars, set(SAMPLE_CONFIG_VALUES[cloud]), f"{cloud}: sample values out of date")

    def test_eventbridge_rules_match_what_the_aws_provider_routes(self):
        src = read("providers/src/aws/events.rs")
        routed = set(re.findall(r'\("(aws\.[a-z0-9]+)",\s*"([^"]+)"\)\s*=>', src))
        self.assertEqual(len(routed), 4, f"expected the four kinds of REFERENCE.md in aws.rs, found {routed}")
        events = locals_of(self.docs["aws"])["interruption_events"]
        patterns = {}
        for key, ev in events.items():
            p = ev["pattern"]
            (source,) = [uq(s) for s in p["source"]]
            (detail_type,) = [uq(s) for s in p['"detail-type"']]
            patterns[(source, detail_type)] = p.get("detail", {})
        self.assertEqual(set(patterns), routed, "EventBridge rules and providers/src/aws/events.rs disagree")

        # The state-change rule sends exactly the states aws.rs acts on.
        m = re.search(r'Some\(((?:"[a-z-]+"\s*\|\s*)*"[a-z-]+")\)\s*=>\s*\{\s*Ok\(Routed::Events', src)
        self.assertIsNotNone(m, "the state match of aws.rs moved; update this test")
        states = set(re.findall(r'"([a-z-]+)"', m.group(1)))
        got = {uq(s) for s in patterns[("aws.ec2", "EC2 Instance State-change Notification")]["state"]}
        self.assertEqual(got, states)

        # The health rule filters what aws.rs would otherwise ignore.
        health = patterns[("aws.health", "AWS Health Event")]
        service = re.search(r'd\.service != "([^"]+)"', src).group(1)
        category = re.search(r'd\.event_type_category != "([^"]+)"', src).group(1)
        self.assertEqual([uq(s) for s in health["service"]], [service])
        self.assertEqual([uq(s) for s in health["eventTypeCategory"]], [category])

        # Each rule targets the queue, and the queue admits those rules alone.
        res = {(t, n): b for _, t, n, b in resources(self.docs["aws"])}
        self.assertEqual(res[("aws_cloudwatch_event_rule", "interruption")]["for_each"], "${local.interruption_events}")
        self.assertIn("aws_sqs_queue.interruptions.arn", res[("aws_cloudwatch_event_target", "interruption")]["arn"])
        policy = [b for _, t, n, b in resources(self.docs["aws"], "data") if n == "interruptions_queue"][0]
        for st in policy["statement"]:
            if uq(st.get("effect", '"Allow"')) == "Allow":
                self.assertEqual([uq(p["identifiers"][0]) for p in st["principals"]], ["events.amazonaws.com"])
                self.assertEqual(st["condition"][0]["values"], "${local.interruption_rule_arns}")

    def test_nodes_boot_the_agent_with_the_agreed_flags(self):
        script = read("terraform/templates/node-boot.sh.tftpl")
        self.assertRegex(
            script,
            r"run --control-plane \$\{control_plane_url\} --bootstrap-token-file \S+ --cloud \$\{cloud\} --work-dir \S+",
        )
        for cloud in CLOUDS:
            boot = str(locals_of(self.docs[cloud])["node_boot_script"])
            self.assertIn("node-boot.sh.tftpl", boot)
            self.assertRegex(boot, r'cloud\s*=\s*\\?"' + cloud + r'\\?"')
        rendered = render(os.path.join(TF, "templates", "node-boot.sh.tftpl"), {
            "cloud": "aws", "control_plane_url": "https://cp.example.com", "token_file": "/etc/spotplane/bootstrap-token",
            "work_dir": "/var/lib/spotplane", "agent_url": "https://example.com/agent", "agent_sha256": "0" * 64,
        })
        self.assertIn("--control-plane https://cp.example.com --bootstrap-token-file $TOKEN_FILE --cloud aws", rendered)
        self.assertTrue(rendered.startswith("#!/bin/bash\n"))

    def test_node_templates(self):
        lt = {n: b for _, t, n, b in resources(self.docs["aws"]) if t == "aws_launch_template"}["node"]
        self.assertEqual(uq(lt["metadata_options"][0]["http_tokens"]), "required", "IMDSv2 must be required")
        self.assertEqual(lt["block_device_mappings"][0]["ebs"][0]["encrypted"], True)
        it = {n: b for _, t, n, b in resources(self.docs["gcp"]) if t == "google_compute_instance_template"}["node"]
        sched = it["scheduling"][0]
        self.assertEqual(uq(sched["provisioning_model"]), "SPOT")
        self.assertEqual(sched["instance_termination_action"], "${var.termination_action}")

    def test_terraform_1_0_compatible(self):
        later_blocks = {"moved", "import", "check", "removed"}
        later_args = re.compile(r"^\s*(nullable|precondition|postcondition|replace_triggered_by)\b", re.M)
        functions = set()
        for path in glob.glob(os.path.join(TF, "**", "*.tf"), recursive=True):
            src = read(path)
            code = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("#", "//")))
            self.assertFalse(later_blocks & set(hcl2.loads(src)), f"{path}: a block Terraform 1.0 lacks")
            self.assertIsNone(later_args.search(code), f"{path}: an argument Terraform 1.0 lacks")
            self.assertNotIn("optional(", code, f"{path}: optional() attributes need Terraform 1.3")
            self.assertNotIn("provider::", code, f"{path}: provider functions need Terraform 1.8")
            functions |= set(called_functions(hcl2.loads(src)))
        for path in glob.glob(os.path.join(TF, "**", "*.tftpl"), recursive=True):
            for expr in re.findall(r"(?<!\$)[$%]\{([^}]*)\}", read(path)):
                functions |= set(re.findall(r"\b([a-z][a-z0-9_]*)\(", re.sub(r'"[^"]*"', '""', expr)))
        self.assertTrue(functions, "no function calls found; the scan is broken")
        rc, out, err = console("[" + ", ".join(f"{f}()" for f in sorted(functions)) + "]")
        unknown = re.findall(r'There is no function named "([^"]+)"', err)
        self.assertFalse(unknown, f"functions Terraform 1.0.3 does not have: {unknown}")

    def test_versions_are_pinned(self):
        for name, doc in list(self.docs.items()) + [(f"examples/{c}", d) for c, d in self.examples.items()]:
            (_, tf), = doc["terraform"]
            self.assertRegex(uq(tf["required_version"]), r"^>= 1\.0\.3, < 2\.0\.0$", name)
            for block in tf["required_providers"]:
                for local, spec in block.items():
                    if local.startswith("__"):
                        continue
                    pin = PROVIDER_PINS[local]
                    self.assertEqual(uq(spec["source"]), pin["source"], f"{name}: {local}")
                    m = re.match(r"^~> (\d+)\.\d+$", uq(spec["version"]))
                    self.assertTrue(m and m.group(1) in pin["majors"], f"{name}: {local} pinned as {spec['version']}")

    def test_provider_major_breaking_changes(self):
        """The breaking changes of AWS 6, Google 6 and 7, AzureRM 4 and 5 that touch these modules."""
        every = list(self.docs.items()) + [(f"examples/{c}", d) for c, d in self.examples.items()]
        seen = set()
        for name, doc in every:
            for kind in ("resource", "data"):
                for f, ty, rname, body in resources(doc, kind):
                    seen.add(ty)
                    removed = REMOVED_ARGS.get(ty, set()) & set(arg_paths(body))
                    self.assertFalse(removed, f"{f}: {ty}.{rname} sets what the pinned major removed: {removed}")
        self.assertTrue(seen & set(REMOVED_ARGS), "no module uses a type REMOVED_ARGS covers; the scan is broken")

        for path in glob.glob(os.path.join(TF, "**", "*.tf"), recursive=True):
            code = code_of(path)
            for ty, attrs in REMOVED_ATTRS.items():
                for m in re.finditer(re.escape(ty) + r"\.[a-z0-9_]+(?:\[[^\]]*\])?\.([a-z0-9_]+)\b", code):
                    self.assertNotIn(m.group(1), attrs, f"{path}: {m.group(0)} is removed or deprecated in the pinned major")

        # AWS 6.0: the region comes from aws_region's region attribute.
        self.assertEqual(locals_of(self.docs["aws"])["region"], "${data.aws_region.current.region}")
        # AWS 6.0: aws_ami with most_recent must name an owner (or filter on owner-id / image-id).
        for f, ty, rname, body in resources(self.docs["aws"], "data"):
            if ty == "aws_ami" and body.get("most_recent") is True:
                filters = {uq(x["name"]) for x in body.get("filter", [])}
                self.assertTrue(body.get("owners") or filters & {"owner-id", "image-id"}, f"{f}: aws_ami.{rname}")
        # AWS 6.0: nullable booleans take true/false only, not 0/1.
        lt = {n: b for _, t, n, b in resources(self.docs["aws"]) if t == "aws_launch_template"}["node"]
        for k, v in lt["block_device_mappings"][0]["ebs"][0].items():
            if k in ("encrypted", "delete_on_termination"):
                self.assertIs(v, True, f"aws_launch_template.node ebs.{k} must be a bool")

        gcp = {(t, n): b for _, t, n, b in resources(self.docs["gcp"])}
        # Google 6.0: Cloud Run v2 services default to deletion_protection = true; follow the switch.
        runs = [b for (t, _), b in gcp.items() if t == "google_cloud_run_v2_service"]
        self.assertTrue(runs)
        for b in runs:
            self.assertEqual(b.get("deletion_protection"), "${var.deletion_protection}")
        # Google 7.0: disable_on_destroy now defaults to false; keep it explicit.
        for (t, n), b in gcp.items():
            if t == "google_project_service":
                self.assertIs(b.get("disable_on_destroy"), False, f"google_project_service.{n}")
        # Google 6.0.1 removed require_ssl: TLS is required through ssl_mode.
        sql = gcp[("google_sql_database_instance", "this")]["settings"][0]
        self.assertEqual(uq(sql["ip_configuration"][0]["ssl_mode"]), "ENCRYPTED_ONLY")
        # The API's edition default (ENTERPRISE_PLUS for POSTGRES_16+) refuses the default tier.
        self.assertIn("edition", sql)
        self.assertIn('"ENTERPRISE"', str(sql["edition"]))

        az = {(t, n): b for _, t, n, b in resources(self.docs["azure"])}
        # AzureRM 5.0: rbac_authorization_enabled is required on Key Vault.
        self.assertIs(az[("azurerm_key_vault", "this")].get("rbac_authorization_enabled"), True)
        # AzureRM 5.0: a Log Analytics workspace is used only with logs_destination = log-analytics.
        for (t, n), b in az.items():
            if t == "azurerm_container_app_environment" and "log_analytics_workspace_id" in b:
                self.assertEqual(uq(b.get("logs_destination")), "log-analytics", f"{t}.{n}")
        # AzureRM 5.0: storage containers and private DNS children name their parent by id.
        self.assertIn("storage_account_id", az[("azurerm_storage_container", "checkpoints")])
        for (t, n), b in az.items():
            if t in ("azurerm_private_dns_a_record", "azurerm_private_dns_zone_virtual_network_link"):
                self.assertRegex(b["private_dns_zone_id"], r"azurerm_private_dns_zone\.[a-z_]+\.id", f"{t}.{n}")
        # AzureRM 5.0: service endpoints are service_endpoint blocks; the firewalls need them.
        endpoints = {n: {uq(e["service"]) for e in b.get("service_endpoint", [])} for (t, n), b in az.items() if t == "azurerm_subnet"}
        self.assertEqual(endpoints["control_plane"], {"Microsoft.Storage", "Microsoft.KeyVault"})
        self.assertEqual(endpoints["nodes"], {"Microsoft.Storage"})

        # AzureRM 4.0: subscription_id in the provider block; 5.0: no skip_provider_registration,
        # and nothing registered by default, so the example registers what the module uses.
        (_, blocks), = [(f, b) for f, b in self.examples["azure"]["provider"]]
        prov = {uq(k): v for k, v in blocks.items()}["azurerm"]
        self.assertEqual(prov.get("subscription_id"), "${var.subscription_id}")
        self.assertNotIn("skip_provider_registration", prov)
        registered = {uq(r) for r in prov.get("resource_providers_to_register", [])}
        needed = {"Microsoft.Compute"} | {rp for ty in {t for t, _ in az} for pre, rp in AZURE_RESOURCE_PROVIDERS if ty.startswith(pre)}
        self.assertFalse(needed - registered, f"examples/azure registers too few resource providers: {needed - registered}")

    def test_variables_are_typed_described_and_validated(self):
        for cloud in CLOUDS:
            for name, body in variables(self.docs[cloud]).items():
                self.assertIn("type", body, f"{cloud}: variable {name} has no type")
                self.assertTrue(uq(body.get("description", "")), f"{cloud}: variable {name} has no description")
                if body["type"] not in ("bool", "${bool}"):
                    self.assertTrue(body.get("validation"), f"{cloud}: variable {name} is not validated")
                for v in body.get("validation", []):
                    msg = uq(v["error_message"])
                    self.assertRegex(msg, r"^[A-Z].*[.?]$", f"{cloud}: {name}: Terraform wants a sentence")

    def test_examples_pass_what_the_modules_need(self):
        for cloud in CLOUDS:
            module_vars = variables(self.docs[cloud])
            required = {n for n, b in module_vars.items() if "default" not in b}
            calls = [b for _, blk in self.examples[cloud].get("module", []) for b in blk.values()]
            self.assertEqual(len(calls), 1)
            (call,) = calls
            self.assertEqual(uq(call["source"]), f"../../{cloud}")
            args = {k for k in call if k not in ("source", "__is_block__") and not k.startswith("__")}
            self.assertFalse(required - args, f"examples/{cloud} misses {required - args}")
            self.assertFalse(args - set(module_vars), f"examples/{cloud} passes unknown {args - set(module_vars)}")

    def test_everything_carries_the_cluster_tag(self):
        cluster = re.search(r'pub const CLUSTER: &str = "([^"]+)";', read("providers/src/lib.rs")).group(1)
        for cloud in CLOUDS:
            loc = locals_of(self.docs[cloud])
            tags = str(loc.get("tags", loc.get("labels")))
            self.assertTrue(cluster in tags or cluster == uq(loc.get("cluster_tag", "")), f"{cloud}: {tags}")
            for f, ty, name, body in resources(self.docs[cloud]):
                if ty in UNTAGGABLE:
                    continue
                self.assertTrue(any(a in body for a in TAG_ARGS), f"{f}: {ty}.{name} has no tags/labels")

    def test_checkov_skips_give_reasons(self):
        for path in glob.glob(os.path.join(TF, "**", "*.tf"), recursive=True):
            for m in re.finditer(r"checkov:skip=([A-Z0-9_]+)(?::(.*))?", read(path)):
                self.assertTrue(m.group(2) and len(m.group(2).strip()) >= 30, f"{path}: {m.group(1)} skipped without a reason")


def arg_paths(body, prefix=""):
    """Dotted paths of every argument and nested block of a parsed block, dynamic blocks included."""
    for k, v in body.items():
        if k.startswith("__"):
            continue
        if k == "dynamic":
            for dyn in v:
                for name, d in dyn.items():
                    yield prefix + uq(name)
                    for content in d.get("content", []) if isinstance(d.get("content"), list) else [d.get("content", {})]:
                        yield from arg_paths(content, prefix + uq(name) + ".")
            continue
        yield prefix + k
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for x in v:
                yield from arg_paths(x, prefix + k + ".")


def code_of(path):
    """A .tf file without its comment lines (and without trailing # comments)."""
    return "\n".join(re.sub(r"\s#[^\"]*$", "", l) for l in read(path).splitlines() if not l.lstrip().startswith(("#", "//")))


def called_functions(node):
    """Names of functions called in the expressions of a parsed document."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "type":  # type constraints: map(string), list(...), object({...})
                continue
            yield from called_functions(v)
    elif isinstance(node, list):
        for v in node:
            yield from called_functions(v)
    elif isinstance(node, str) and "${" in node:
        for expr in interpolations(node):
            # String literals: escaped inside a template string, plain in a bare expression.
            expr = re.sub(r'\\"(?:[^"\\]|\\[^"])*\\"', '""', expr)
            expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
            yield from re.findall(r"(?<![\w.])([a-z][a-z0-9_]*)\(", expr)


def interpolations(s):
    """The expressions inside ${ ... } of a string, braces balanced."""
    i = 0
    while True:
        i = s.find("${", i)
        if i < 0:
            return
        depth, j = 1, i + 2
        while j < len(s) and depth:
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            j += 1
        yield s[i + 2 : j - 1]
        i = j

if __name__ == "__main__":
    unittest.main(verbosity=2)
