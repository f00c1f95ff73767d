#!/usr/bin/env bash
# Checks the deployment files as far as a machine without a container engine
# can: the systemd unit (systemd-analyze verify and an offline security
# review), compose.yaml and the files it mounts (Prometheus configuration and
# rules, Grafana provisioning, the dashboard), deploy/prometheus.yml
# (promtool), the Dockerfile's essentials, and the runbook links of the
# alert rules. Builds no image and starts nothing. With a docker compose
# client present, `docker compose config` validates compose.yaml as well.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'check-deploy: %s\n' "$*"; }
fail() {
  printf 'check-deploy: FAIL: %s\n' "$*" >&2
  exit 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- systemd unit ----------------------------------------------------------
unit=deploy/idemgate.service
if ! command -v systemd-analyze >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || fail "systemd-analyze not found (Debian package systemd)"
  say "installing systemd (for systemd-analyze)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null; }
fi
grep -q '^ExecStart=/usr/local/bin/idemgate serve$' "$unit" ||
  fail "$unit: expected ExecStart=/usr/local/bin/idemgate serve"

# verify refuses a unit whose binary is missing, and the binary is not
# installed here: verify a copy that differs only in the ExecStart path,
# which points at an executable stand-in.
mkdir -p "$tmp/bin" "$tmp/unit"
cp /bin/true "$tmp/bin/idemgate"
copy="$tmp/unit/idemgate.service"
sed "s#^ExecStart=/usr/local/bin/idemgate #ExecStart=$tmp/bin/idemgate #" "$unit" >"$copy"
changed=$(diff "$unit" "$copy" | grep -c '^>' || true)
[ "$changed" = 1 ] || fail "$unit: the verified copy differs in $changed lines, expected 1 (ExecStart)"

# verify exits 0 on unknown directives and unparsable values and only prints
# them, so any line about the unit is a failure. Messages name the copy: put
# the unit's own path back (the line numbers are the same).
if ! out=$(systemd-analyze verify "$copy" 2>&1 | sed "s#$copy#$unit#g"; exit "${PIPESTATUS[0]}"); then
  fail "systemd-analyze verify $unit: $out"
fi
if grep -q 'idemgate\.service' <<<"$out"; then
  fail "systemd-analyze verify $unit: $out"
fi
[ -z "$out" ] || say "note: systemd-analyze verify printed, about other units: $out"
say "ok: systemd-analyze verify $unit (ExecStart pointed at a stand-in binary)"

# The hardening the unit must keep (present, not just implied).
for directive in \
  'DynamicUser=yes' 'StateDirectory=idemgate' 'NoNewPrivileges=yes' \
  'ProtectSystem=strict' 'ProtectHome=yes' 'PrivateTmp=yes' 'PrivateDevices=yes' \
  'ProtectKernelTunables=yes' 'ProtectKernelModules=yes' 'ProtectKernelLogs=yes' \
  'ProtectControlGroups=yes' 'RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX' \
  'RestrictNamespaces=yes' 'LockPersonality=yes' 'MemoryDenyWriteExecute=yes' \
  'SystemCallFilter=@system-service' 'CapabilityBoundingSet=' 'Restart=on-failure' \
  'EnvironmentFile=-/etc/idemgate/env' 'KillSignal=SIGTERM' \
  'Environment=IDEMGATE_ADMIN_LISTEN=127.0.0.1:9464'; do
  grep -qxF "$directive" "$unit" || fail "$unit: missing $directive"
done
say "ok: $unit has every required hardening directive"

# Offline security review: exposure on systemd's 0-10 scale, at most 2.0.
if ! out=$(systemd-analyze security --offline=yes --threshold=20 "$copy" 2>&1); then
  fail "systemd-analyze security: $(tail -n 1 <<<"$out")"
fi
say "ok: systemd-analyze security --offline: $(grep -o 'Overall exposure level for [^:]*: [0-9.]* [A-Z]*' <<<"$out" | sed 's/ for [^:]*:/:/') (at most 2.0 allowed)"

# --- Dockerfile and .dockerignore ------------------------------------------
for line in \
  'FROM rust:1.95-bookworm AS builder' 'FROM debian:bookworm-slim' \
  'EXPOSE 8080 9464' 'USER 10001:10001' 'ENTRYPOINT ["idemgate"]'; do
  grep -qxF "$line" Dockerfile || fail "Dockerfile: missing line: $line"
done
grep -q -- '--locked' Dockerfile || fail "Dockerfile: the build must use --locked"
grep -q '^CMD \["serve", .*"--listen", "0.0.0.0:8080", "--admin-listen", "0.0.0.0:9464"' Dockerfile ||
  fail "Dockerfile: CMD must serve on 0.0.0.0:8080 with the admin listener on 0.0.0.0:9464"
grep -q '^HEALTHCHECK ' Dockerfile || fail "Dockerfile: no HEALTHCHECK"
for pattern in target/ .venv/ .git/; do
  grep -qxF "$pattern" .dockerignore || fail ".dockerignore: missing $pattern"
done
say "ok: Dockerfile (stages, EXPOSE, USER, ENTRYPOINT, CMD, HEALTHCHECK) and .dockerignore"

# --- Prometheus configuration -----------------------------------------------
command -v promtool >/dev/null 2>&1 || fail "promtool not found (scripts/setup.sh installs it)"
if ! out=$(promtool check config deploy/prometheus.yml 2>&1); then
  fail "promtool check config deploy/prometheus.yml: $out"
fi
say "ok: promtool check config deploy/prometheus.yml (rule files: $(grep -c 'SUCCESS: .* rules found' <<<"$out") checked)"

# --- compose.yaml, mounts, provisioning, runbook links (Python + PyYAML) ----
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
if ! "$py" -c 'import yaml' 2>/dev/null; then
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  say "installing PyYAML into .venv"
  .venv/bin/pip install -q --disable-pip-version-check pyyaml
  py=.venv/bin/python
fi

"$py" - <<'PY'
import json
import os
import re
import sys

import yaml

errors = []


def check(cond, message):
    if not cond:
        errors.append(message)
    return cond


def seconds(text):
    """`45s`, `1m30s`, `2m` -> seconds; None when unparsable."""
    text = str(text).strip().strip('"')
    parts = re.findall(r"(\d+)(ms|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(int(n) * scale[u] for n, u in parts)


def container_port(spec):
    if isinstance(spec, dict):
        return int(spec["target"])
    return int(str(spec).split(":")[-1].split("/")[0])


def mounts(service):
    """(host source, container target) of the service's bind mounts."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            if v.get("type") == "bind":
                out.append((v["source"], v["target"]))
            continue
        parts = str(v).split(":")
        if parts[0].startswith((".", "/")):
            out.append((parts[0], parts[1]))
    return out


def host_path_of(service, target):
    """The host file mounted at `target`, directly or through a directory."""
    for source, mount in mounts(service):
        if target == mount:
            return os.path.normpath(source)
        if target.startswith(mount.rstrip("/") + "/"):
            return os.path.normpath(os.path.join(source, target[len(mount.rstrip("/")) + 1:]))
    return None


with open("config/idemgate.example.toml") as f:
    grace = seconds(re.search(r'^shutdown_grace\s*=\s*"([^"]+)"', f.read(), re.M).group(1))

with open("compose.yaml") as f:
    compose = yaml.safe_load(f)
services = compose.get("services", {})
for name in ("gateway", "redis", "prometheus", "grafana"):
    check(name in services, f"compose.yaml: no service {name}")
if errors:
    sys.exit("\n".join(errors))

for name, svc in services.items():
    image = svc.get("image")
    if "build" not in svc:
        tag = image.rsplit(":", 1)[1] if image and ":" in image.split("/")[-1] else ""
        check(tag and tag != "latest" and re.search(r"\d", tag),
              f"compose.yaml: {name}: image {image!r} is not pinned to a version tag")
    for source, _ in mounts(svc):
        check(os.path.exists(source), f"compose.yaml: {name}: mounted {source} does not exist")

gw = services["gateway"]
check("build" in gw, "compose.yaml: gateway must be built from the Dockerfile (build:)")
ports = {container_port(p) for p in gw.get("ports", [])}
check({8080, 9464} <= ports, f"compose.yaml: gateway publishes {sorted(ports)}, needs 8080 and 9464")
cmd = [str(c) for c in gw.get("command", [])]


def flag(name):
    return cmd[cmd.index(name) + 1] if name in cmd[:-1] else None


check(cmd[:1] == ["serve"], "compose.yaml: gateway command must start with serve")
check(flag("--listen") == "0.0.0.0:8080", "compose.yaml: gateway must pass --listen 0.0.0.0:8080")
check(flag("--admin-listen") == "0.0.0.0:9464", "compose.yaml: gateway must pass --admin-listen 0.0.0.0:9464")
store = flag("--store") or ""
m = re.fullmatch(r"redis://([^:/]+):(\d+)", store)
check(m and m.group(1) in services, f"compose.yaml: gateway store {store!r} is not redis://<service>:<port>")
env = gw.get("environment", {})
if isinstance(env, list):
    env = dict(e.split("=", 1) for e in env)
check(re.fullmatch(r"\$\{IDEMGATE_UPSTREAM:-[^}]+\}", str(env.get("IDEMGATE_UPSTREAM", ""))),
      "compose.yaml: gateway needs IDEMGATE_UPSTREAM: ${IDEMGATE_UPSTREAM:-default}")
if "IDEMGATE_ALERT_RULES" in env:
    src = host_path_of(gw, env["IDEMGATE_ALERT_RULES"])
    check(src and os.path.exists(src) and os.path.samefile(src, "ops/alerts.yml"),
          "compose.yaml: gateway's IDEMGATE_ALERT_RULES is not ops/alerts.yml")
stop = seconds(gw.get("stop_grace_period", "10s"))
check(stop is not None and stop > grace,
      f"compose.yaml: gateway stop_grace_period {gw.get('stop_grace_period')} must exceed shutdown_grace ({grace}s)")

# Prometheus: the configuration compose loads is deploy/prometheus.yml, and
# its rule files resolve, inside the container, to the mounted ops/alerts.yml.
prom = services["prometheus"]
config_path = next((c.split("=", 1)[1] for c in prom.get("command", [])
                    if str(c).startswith("--config.file=")), "/etc/prometheus/prometheus.yml")
src = host_path_of(prom, config_path)
check(src and os.path.samefile(src, "deploy/prometheus.yml"),
      f"compose.yaml: prometheus loads {config_path}, which is not deploy/prometheus.yml")
with open("deploy/prometheus.yml") as f:
    prom_config = yaml.safe_load(f)
rule_files = prom_config.get("rule_files") or []
check(rule_files, "deploy/prometheus.yml: no rule_files")
for rule in rule_files:
    inside = os.path.normpath(os.path.join(os.path.dirname(config_path), rule))
    local = os.path.normpath(os.path.join("deploy", rule))
    src = host_path_of(prom, inside)
    check(src and os.path.exists(src) and os.path.exists(local) and os.path.samefile(src, local),
          f"compose.yaml: prometheus resolves rule file {rule} to {inside}, not mounted from {local}")
    check(os.path.exists(local) and os.path.samefile(local, "ops/alerts.yml"),
          f"deploy/prometheus.yml: rule file {rule} is not ops/alerts.yml")
targets = [t for sc in prom_config.get("scrape_configs", [])
           for st in sc.get("static_configs", []) for t in st.get("targets", [])]
check("gateway:9464" in targets, f"deploy/prometheus.yml: does not scrape gateway:9464 ({targets})")

# Grafana: provisioning mounted; the data source points at the prometheus
# service; the dashboard provider's folder holds ops/grafana-dashboard.json.
graf = services["grafana"]
prov = host_path_of(graf, "/etc/grafana/provisioning")
check(prov and os.path.samefile(prov, "deploy/grafana/provisioning"),
      "compose.yaml: grafana must mount deploy/grafana/provisioning at /etc/grafana/provisioning")
urls, paths = [], []
for kind, key in (("datasources", "datasources"), ("dashboards", "providers")):
    folder = os.path.join("deploy/grafana/provisioning", kind)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        with open(os.path.join(folder, name)) as f:
            for item in (yaml.safe_load(f) or {}).get(key, []):
                if kind == "datasources" and item.get("type") == "prometheus":
                    urls.append(item.get("url", ""))
                if kind == "dashboards":
                    paths.append(item.get("options", {}).get("path", ""))
check("http://prometheus:9090" in urls, f"grafana provisioning: no Prometheus data source at http://prometheus:9090 ({urls})")
dashboards = [host_path_of(graf, t) for _, t in mounts(graf)
              if any(t.startswith(p.rstrip("/") + "/") for p in paths if p)]
check(any(d and os.path.samefile(d, "ops/grafana-dashboard.json") for d in dashboards),
      f"compose.yaml: no dashboard provider folder {paths} holds ops/grafana-dashboard.json")
with open("ops/grafana-dashboard.json") as f:
    dashboard = json.load(f)
panels = {p.get("title") for p in dashboard.get("panels", [])}
home = dict(e.split("=", 1) for e in graf["environment"]) if isinstance(graf.get("environment"), list) \
    else (graf.get("environment") or {})
if "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH" in home:
    src = host_path_of(graf, home["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    check(src and os.path.samefile(src, "ops/grafana-dashboard.json"),
          "compose.yaml: grafana's home dashboard path is not the mounted dashboard")

# The systemd unit stops after the drain.
with open("deploy/idemgate.service") as f:
    unit = dict(l.strip().split("=", 1) for l in f if re.match(r"^[A-Za-z]+=", l))
stop = seconds(unit.get("TimeoutStopSec", "90s"))
check(stop is not None and stop > grace,
      f"deploy/idemgate.service: TimeoutStopSec={unit.get('TimeoutStopSec')} must exceed shutdown_grace ({grace}s)")

# Every alert links its own runbook section, and the runbook's panel names
# are the dashboard's.
base = "https://github.com/idemgate/idemgate/blob/main/docs/runbook.md#"
with open("docs/runbook.md") as f:
    runbook = f.read()


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


anchors = {slug(h): h for h in re.findall(r"^#{1,6} (.+)$", runbook, re.M)}
with open("ops/alerts.yml") as f:
    alert_rules = yaml.safe_load(f)
alerts = [r for g in alert_rules["groups"] for r in g["rules"] if "alert" in r]
check(alerts, "ops/alerts.yml: no alerts")
for r in alerts:
    url = r.get("annotations", {}).get("runbook_url", "")
    check(url == base + slug(r["alert"]),
          f"ops/alerts.yml: {r['alert']}: runbook_url {url!r}, expected {base + slug(r['alert'])}")
    check(anchors.get(slug(r["alert"])) == r["alert"],
          f"docs/runbook.md: no section headed {r['alert']}")
named = re.findall(r"\b[Pp]anel\s+\*([^*]+?)\*", re.sub(r"\s+", " ", runbook))
check(named, "docs/runbook.md: names no dashboard panel (Panel *Title*)")
for name in named:
    check(name in panels, f"docs/runbook.md: panel *{name}* is not in ops/grafana-dashboard.json")

if errors:
    sys.exit("\n".join("check-deploy: FAIL: " + e for e in errors))
print(f"check-deploy: ok: compose.yaml: services {', '.join(services)}; gateway publishes 8080 and 9464; images pinned; mounts exist")
print(f"check-deploy: ok: prometheus in compose loads deploy/prometheus.yml and {', '.join(rule_files)} (= ops/alerts.yml); scrapes gateway:9464")
print("check-deploy: ok: grafana provisioning: data source http://prometheus:9090, dashboard ops/grafana-dashboard.json")
print(f"check-deploy: ok: stop timeouts exceed shutdown_grace ({grace:g}s): compose stop_grace_period, unit TimeoutStopSec")
print(f"check-deploy: ok: {len(alerts)} alerts link their docs/runbook.md section; the {len(set(named))} panels the runbook names are the dashboard's")
PY

# --- docker compose, where a client with the compose plugin exists ---------
if docker compose version >/dev/null 2>&1; then
  docker compose -f compose.yaml config -q || fail "docker compose config"
  say "ok: docker compose config"
else
  say "note: no docker compose client: compose.yaml checked with PyYAML only"
fi
say "all deployment checks passed"
