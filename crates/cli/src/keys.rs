//! `idemgate keys show KEY`: one key's record and timeline, read from the
//! store the gateway uses; `idemgate keys forget KEY`: the operator's way
//! to clear a key (such as an outcome-unknown answer on a charging route,
//! once the upstream's side has been checked) so the next retry runs.
//!
//! A record is addressed by (tenant, namespace, key). The tenant is given
//! as the id the gateway logs (`--tenant`), or computed from the raw
//! credential with the same function the gateway uses, so nobody has to
//! hash an API key by hand. The credential comes from IDEMGATE_CREDENTIAL
//! or standard input (`--credential-stdin`), never from the command line,
//! where every user of the machine could read it. Exit status: 0 when the key
//! has a record or attempts, 1 when it has neither, 2 on a usage or store
//! error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use idemgate_engine::backend::now_ms;
use idemgate_engine::{Attempt, AttemptOutcome, ClientKey, Record, ScopedKey, Store};
use idemgate_gateway::config::{self, RawConfig, RouteConfig, StoreUrl};
use idemgate_gateway::{GatewayConfig, Overrides};
use serde_json::json;

use crate::check::Format;

mod render;
use render::{as_json, text};

const EXIT_NOT_FOUND: u8 = 1;
const EXIT_USAGE: u8 = 2;

/// `idemgate keys …`
#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Print a key's current state and the timeline of its attempts.
    Show(ShowArgs),
    /// Delete a key's record (whatever its state), so the next request with
    /// it runs again; the timeline keeps a `forgotten` entry. Exit 1 when
    /// there was no record.
    Forget(ShowArgs),
    /// Print a new line for the encryption key file (`ID:BASE64KEY`, not
    /// marked active). As a file's only line it is the active key
    /// (`… > keys`); added to a file with keys (`… >> keys`) it only opens
    /// records until `*` is put in front of it.
    GenerateEncryptionKey(GenerateArgs),
}

/// Flags of `idemgate keys generate-encryption-key`.
#[derive(Debug, Args)]
pub(crate) struct GenerateArgs {
    /// The key id: 1 to 32 characters of `A-Z a-z 0-9 . _ -` (default: the
    /// current UTC date and time, e.g. `20260130T101500Z`).
    #[arg(long)]
    id: Option<String>,
}

/// A key id from the current time: unique enough for rotations made by
/// hand, and sortable.
fn default_key_id() -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    now.chars().filter(|c| *c != '-' && *c != ':').collect()
}

fn generate(args: &GenerateArgs) -> ExitCode {
    let id = args.id.clone().unwrap_or_else(default_key_id);
    match idemgate_seal::generate_key_line(&id) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idemgate keys generate-encryption-key: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Flags of `idemgate keys show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The idempotency key, as the client sent it (or as derived).
    key: String,
    /// The tenant id as the gateway logs it (32 hex digits, or `anonymous`).
    /// Wins over IDEMGATE_CREDENTIAL.
    #[arg(long, conflicts_with = "credential_stdin")]
    tenant: Option<String>,
    /// Read the raw credential the client sent from standard input (one
    /// line): the `Authorization` header value (`Bearer sk-…`; a bare token
    /// is also tried with `Bearer `), or the value of the route's tenant
    /// header. Without it, IDEMGATE_CREDENTIAL is read. Hashed here, never
    /// stored or printed.
    #[arg(long)]
    credential_stdin: bool,
    /// Refused: a credential on the command line is visible to every user
    /// of the machine (`ps`) and stays in shell history.
    #[arg(long = "credential", hide = true, value_name = "REFUSED")]
    credential_argv: Option<String>,
    /// The route id (namespace) of the key; default: the only route's id.
    #[arg(long)]
    namespace: Option<String>,
    /// TOML configuration file of the gateway.
    #[arg(long, short, env = "IDEMGATE_CONFIG")]
    config: Option<PathBuf>,
    /// Store URL (`sqlite:PATH`); overrides the configuration's.
    #[arg(long)]
    store: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Runs a `keys` subcommand.
pub(crate) async fn run(cmd: KeysCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KeysCommand::GenerateEncryptionKey(args) => Ok(generate(&args)),
        KeysCommand::Show(args) => match show(&args).await {
            Ok(code) => Ok(code),
            Err(e) => {
                eprintln!("idemgate keys show: {e:#}");
                Ok(ExitCode::from(EXIT_USAGE))
            }
        },
        KeysCommand::Forget(args) => match forget(&args).await {
            Ok(code) => Ok(code),
            Err(e) => {
                eprintln!("idemgate keys forget: {e:#}");
                Ok(ExitCode::from(EXIT_USAGE))
            }
        },
    }
}

/// The store and the routes, from the file, `IDEMGATE_*` and `--store`.
/// Without any route or upstream configured, the gateway's implicit
/// single route `/` is assumed, so `--store` alone is enough.
fn deployment(args: &ShowArgs) -> anyhow::Result<(StoreUrl, Vec<RouteConfig>, Option<PathBuf>)> {
    let overrides = Overrides {
        store: args.store.clone(),
        ..Overrides::default()
    };
    let figment = config::figment(args.config.as_deref(), &overrides)?;
    let raw: RawConfig = figment.extract().map_err(Box::new).map_err(|e| {
        anyhow::Error::new(idemgate_gateway::ConfigError::from(e)).context("invalid configuration")
    })?;
    if raw.routes.is_empty() && raw.upstream.is_none() {
        let store = StoreUrl::parse(raw.store.as_deref().unwrap_or(config::DEFAULT_STORE))
            .map_err(|m| anyhow::anyhow!("store: {m}"))?;
        let key_file = raw.encryption_key_file.as_ref().map(|p| p.relative());
        // Any upstream will do: only the implicit route's id and tenant
        // source are used.
        let implicit = GatewayConfig::from_raw(RawConfig {
            upstream: Some("http://127.0.0.1:1".into()),
            ..RawConfig::default()
        })?;
        return Ok((store, implicit.routes, key_file));
    }
    let c = GatewayConfig::from_raw(raw).context("invalid configuration")?;
    Ok((c.store, c.routes, c.encryption_key_file))
}

async fn open(
    url: &StoreUrl,
) -> anyhow::Result<(Arc<dyn Store>, Option<idemgate_sqlite::SqliteStore>)> {
    match url {
        StoreUrl::Sqlite(path) => {
            // Never create a store at a mistyped path.
            anyhow::ensure!(
                path.is_file(),
                "no store file at {} (the gateway's `store`; default sqlite:idemgate.db in its working directory)",
                path.display()
            );
            let path = path.clone();
            let store =
                tokio::task::spawn_blocking(move || idemgate_sqlite::SqliteStore::open(path))
                    .await
                    .context("cannot open the store")?
                    .with_context(|| format!("cannot open the store {url}"))?;
            Ok((Arc::new(store.clone()), Some(store)))
        }
        StoreUrl::Memory => anyhow::bail!(
            "a memory: store lives inside the gateway process; ask the gateway instead (GET /admin/keys/{{key}}/timeline or DELETE /admin/keys/{{key}} on the admin listener)"
        ),
        other => {
            let store = idemgate_gateway::open_records(other, None)
                .await
                .with_context(|| format!("cannot open the store {other}"))?;
            Ok((store, None))
        }
    }
}

/// The environment variable `keys show` reads the raw credential from.
const CREDENTIAL_ENV: &str = "IDEMGATE_CREDENTIAL";

/// The raw credential: from standard input with `--credential-stdin`,
/// else from IDEMGATE_CREDENTIAL (unless `--tenant` is given). Never from
/// the command line.
fn credential(args: &ShowArgs) -> anyhow::Result<Option<String>> {
    if args.credential_argv.is_some() {
        anyhow::bail!(
            "--credential is not accepted: a credential on the command line is visible to other users (ps) and stays in shell history; set {CREDENTIAL_ENV} or pipe it with --credential-stdin"
        );
    }
    if args.credential_stdin {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .context("cannot read the credential from standard input")?;
        let line = line.trim_end_matches(['\r', '\n']);
        anyhow::ensure!(
            !line.trim().is_empty(),
            "--credential-stdin: standard input held no credential"
        );
        return Ok(Some(line.to_owned()));
    }
    if args.tenant.is_some() {
        return Ok(None);
    }
    Ok(std::env::var(CREDENTIAL_ENV)
        .ok()
        .filter(|c| !c.trim().is_empty()))
}

/// What was looked up and found.
pub(crate) struct Found {
    pub(crate) scoped: ScopedKey,
    pub(crate) tenant_from: &'static str,
    pub(crate) record: Option<Record>,
    pub(crate) timeline: Vec<Attempt>,
}

async fn lookup(
    store: &dyn Store,
    scoped: ScopedKey,
) -> anyhow::Result<(Option<Record>, Vec<Attempt>)> {
    let record = store.get(&scoped).await.context("cannot read the record")?;
    let timeline = store
        .timeline(&scoped)
        .await
        .context("cannot read the timeline")?;
    Ok((record, timeline))
}

/// Where a key lives: the store, the namespace, its route (when
/// configured), and the candidate tenants in order (the first with anything
/// stored wins).
struct Address {
    key: ClientKey,
    url: StoreUrl,
    namespace: String,
    /// How long the timeline note of a forget is kept: the route's
    /// `done_ttl`, or the default one for a namespace not configured.
    done_ttl: Duration,
    candidates: Vec<(String, &'static str)>,
    /// The gateway's encryption key file, to open sealed records.
    key_file: Option<PathBuf>,
}

fn address(args: &ShowArgs) -> anyhow::Result<Address> {
    let key = ClientKey::parse(&args.key).map_err(|e| anyhow::anyhow!("KEY: {e}"))?;
    let credential = credential(args)?;
    let (url, routes, key_file) = deployment(args)?;
    let route = match &args.namespace {
        Some(ns) => routes.iter().find(|r| &r.id == ns),
        None => match routes.as_slice() {
            [only] => Some(only),
            _ => {
                let ids: Vec<&str> = routes.iter().map(|r| r.id.as_str()).collect();
                anyhow::bail!(
                    "the configuration has {} routes ({}): pass --namespace with the route id",
                    routes.len(),
                    ids.join(", ")
                );
            }
        },
    };
    let namespace = match (&args.namespace, route) {
        (Some(ns), _) => ns.clone(),
        (None, Some(r)) => r.id.clone(),
        (None, None) => anyhow::bail!("no route"),
    };
    let authorization =
        route.is_none_or(|r| r.tenant.headers().iter().any(|h| h == "authorization"));

    // Candidate tenants, in order; the first with anything stored wins.
    let mut candidates: Vec<(String, &'static str)> = Vec::new();
    match (&args.tenant, &credential) {
        (Some(t), _) => candidates.push((t.clone(), "given")),
        (None, Some(c)) => {
            candidates.push((
                idemgate_layer::key::tenant_id(c.as_bytes()),
                "hash of the credential",
            ));
            if authorization && !c.trim().contains(char::is_whitespace) {
                candidates.push((
                    idemgate_layer::key::tenant_id(format!("Bearer {}", c.trim()).as_bytes()),
                    "hash of `Bearer <credential>`",
                ));
            }
        }
        (None, None) => candidates.push((
            idemgate_layer::key::ANONYMOUS.to_owned(),
            "no credential: anonymous",
        )),
    }

    Ok(Address {
        key,
        url,
        namespace,
        done_ttl: route.map_or(Duration::from_secs(24 * 3600), |r| r.done_ttl),
        candidates,
        key_file,
    })
}

async fn show(args: &ShowArgs) -> anyhow::Result<ExitCode> {
    let Address {
        key,
        url,
        namespace,
        candidates,
        key_file,
        ..
    } = address(args)?;
    let (mut store, sqlite) = open(&url).await?;
    if let Some(path) = key_file {
        // Sealed payloads are opened with the gateway's key ring.
        let ring = idemgate_gateway::load_key_ring(&path)?;
        store = Arc::new(idemgate_seal::SealedStore::new(store, ring));
    }
    let mut found: Option<Found> = None;
    for (tenant, tenant_from) in &candidates {
        let scoped = ScopedKey::new(tenant.clone(), namespace.clone(), key.clone());
        let (record, timeline) = lookup(store.as_ref(), scoped.clone()).await?;
        let hit = record.is_some() || !timeline.is_empty();
        if hit || found.is_none() {
            found = Some(Found {
                scoped,
                tenant_from,
                record,
                timeline,
            });
        }
        if hit {
            break;
        }
    }
    if let Some(s) = sqlite {
        s.close();
    }
    let Some(found) = found else {
        anyhow::bail!("no tenant to look up");
    };
    let exists = found.record.is_some() || !found.timeline.is_empty();
    match args.format {
        Format::Text => print!("{}", text(&url, &found)),
        Format::Json => println!("{}", as_json(&url, &found)),
    }
    if exists {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "no record and no attempts for key `{}` in namespace `{}` for tenant {} ({}); check the credential or --tenant, and --namespace",
            found.scoped.key.as_str(),
            found.scoped.namespace,
            found.scoped.tenant,
            found.tenant_from
        );
        Ok(ExitCode::from(EXIT_NOT_FOUND))
    }
}

async fn forget(args: &ShowArgs) -> anyhow::Result<ExitCode> {
    let Address {
        key,
        url,
        namespace,
        done_ttl,
        candidates,
        ..
    } = address(args)?;
    let (store, sqlite) = open(&url).await?;
    // Forgetting through the replay cache's wrapper (holding nothing here)
    // waits out the copies the gateway's replicas may hold, so the key is
    // answered from the old record nowhere once this command returns.
    let store: Arc<dyn Store> = Arc::new(idemgate_engine::CachedStore::new(store, 0));
    let note = Attempt {
        at_ms: now_ms(),
        replica: "idemgate keys forget".to_owned(),
        outcome: AttemptOutcome::Forgotten,
        status: None,
        latency_us: 0,
        repeated: None,
    };
    let mut forgotten = None;
    let mut failed = None;
    for (tenant, tenant_from) in &candidates {
        let scoped = ScopedKey::new(tenant.clone(), namespace.clone(), key.clone());
        match store.forget(&scoped, &note, done_ttl).await {
            Ok(true) => {
                forgotten = Some((scoped, *tenant_from));
                break;
            }
            Ok(false) => {}
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    if let Some(s) = sqlite {
        s.close();
    }
    if let Some(e) = failed {
        return Err(anyhow::Error::new(e).context("cannot forget the key"));
    }
    match (forgotten, args.format) {
        (Some((scoped, _)), Format::Json) => {
            println!(
                "{}",
                json!({
                    "key": scoped.key.as_str(),
                    "tenant": scoped.tenant,
                    "namespace": scoped.namespace,
                    "store": url.to_string(),
                    "forgotten": true,
                })
            );
            Ok(ExitCode::SUCCESS)
        }
        (Some((scoped, tenant_from)), Format::Text) => {
            println!(
                "forgot key `{}` in namespace `{}` for tenant {} ({tenant_from}); the next request with it runs again",
                scoped.key.as_str(),
                scoped.namespace,
                scoped.tenant
            );
            Ok(ExitCode::SUCCESS)
        }
        (None, _) => {
            let tenants: Vec<&str> = candidates.iter().map(|(t, _)| t.as_str()).collect();
            eprintln!(
                "no record for key `{}` in namespace `{namespace}` for tenant {}; check the credential or --tenant, and --namespace",
                key.as_str(),
                tenants.join(" or ")
            );
            Ok(ExitCode::from(EXIT_NOT_FOUND))
        }
    }
}
