//! Importing the platform's users, passwords, API keys, invitations,
//! second factors and signing settings into keygate's store (`keygate
//! import platform`).
//!
//! - `source.rs` reads the platform's database, read-only, streaming rows;
//! - `plan.rs` maps each row and decides what to do with it;
//! - this file runs the import batch by batch, applies the plan through the
//!   store (`store::platform`) and counts what it did;
//! - `sync.rs` runs the same import inside `keygate serve` every
//!   `[platform] sync_interval`, and looks up invitations and reset links
//!   keygate does not know yet ([`lookup_token`]).
//!
//! Memory stays bounded by the batch size, plus one id per row seen (to find
//! the rows deleted on the platform since the last import).

pub mod plan;
pub mod source;
pub mod sync;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::pin::pin;
use std::sync::Arc;

use base64::Engine;
use futures_util::StreamExt;
use serde::Serialize;
use uuid::Uuid;

use crate::auth::api_key::KeyDigest;
use crate::auth::at_rest::Sealer;
use crate::identity::NULL_UUID;
use crate::store::{
    Audit, PlatformKey, PlatformUser, PublicCustomer, Published, Revocation, RowKind, Store,
    StoreError, TwoFactorRecord,
};
use plan::{
    ImportedTwoFactor, Plan, PlatformSecret, PlatformTwoFactor, Refused, TwoFactorPlan, code,
};
pub use source::TokenKind;
use source::{KeyRow, Source, TwoFaRow, UserRow};

/// Rows per transaction.
pub const BATCH: usize = 500;

/// Progress is reported every this many rows.
const PROGRESS_EVERY: u64 = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("the platform's database URL is not valid: {0}")]
    Url(String),
    #[error("cannot reach the platform's database at {place} (database {database:?}): {cause}")]
    Unreachable {
        place: String,
        database: String,
        cause: String,
    },
    #[error(
        "this is not the platform's database (or a version keygate cannot import from): missing {}",
        .0.join(", ")
    )]
    NotPlatform(Vec<String>),
    #[error("reading the platform's database: {0}")]
    Source(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What to import and how.
#[derive(Debug, Clone)]
pub struct Options {
    pub database_url: String,
    /// Read and validate everything, write nothing.
    pub dry_run: bool,
    /// Remove from keygate what was imported and is gone from the platform.
    pub prune: bool,
    /// Seals TOTP secrets and digests backup codes as the server on this
    /// store does (the server's `two_factor_sealer`).
    pub sealer: Arc<Sealer>,
    /// Who the audit events name.
    pub origin: Origin,
    /// Whether this keygate sends mail (`[mail]`): the platform's EMAIL
    /// second factors are imported only then.
    pub mail: bool,
    /// `login.max_bcrypt_cost`: a password hash of a higher cost is not
    /// imported.
    pub max_bcrypt_cost: u32,
}

/// Who runs an import: an operator, or the sync inside `keygate serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    CommandLine,
    Sync,
}

impl Origin {
    fn audit(self, action: &'static str) -> Audit {
        match self {
            Origin::CommandLine => Audit::command_line(action),
            Origin::Sync => Audit::platform_sync(action),
        }
    }
}

/// Imported second factors of one user, by provider.
type TwoFactorMemory = BTreeMap<String, ImportedTwoFactor>;

/// What happened to the rows of one kind.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub added: u64,
    pub updated: u64,
    pub unchanged: u64,
    pub skipped: u64,
    /// Imported before and gone from the platform since.
    pub deleted_on_platform: u64,
    /// Of those, removed from keygate (`--prune`).
    pub removed: u64,
}

/// A row that was not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub kind: &'static str,
    pub id: String,
    /// The user's e-mail, or the key's description.
    pub name: String,
    /// A short code of the reason ([`plan::code`]), the `reason` label of
    /// `keygate_platform_sync_skipped_total`.
    pub code: &'static str,
    pub reason: String,
}

/// The platform's signing settings: what became of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Signing {
    /// `imported`, `unchanged`, `absent` or `invalid`.
    pub state: &'static str,
    pub issuer: Option<String>,
    pub reason: Option<String>,
}

/// The bootstrap administrator `keygate serve` creates in an empty store,
/// once the platform's own administrator is imported and can log in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapAdmin {
    pub email: String,
    /// `removed` (in a dry run: would be), or `kept`: it has been used.
    pub state: &'static str,
    /// Why it is kept.
    pub reason: Option<String>,
}

/// The outcome of an import.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub dry_run: bool,
    pub users: Counts,
    pub keys: Counts,
    /// Configured second factors (one per user and provider).
    pub two_factors: Counts,
    pub skipped: Vec<Skipped>,
    pub deleted_users: Vec<Uuid>,
    pub deleted_keys: Vec<Uuid>,
    pub signing: Signing,
    /// The customers marked public on the platform: their ids open
    /// `POST /api/auth/login/public`. The stored set is replaced by them.
    pub public_customers: u64,
    /// What became of the bootstrap administrator, when the store has one and
    /// the import brings the platform's administrator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_admin: Option<BootstrapAdmin>,
    /// What the writes published, for a running server to apply to its own
    /// caches and open sockets ([`crate::auth::Authenticator::revoke`]).
    #[serde(skip)]
    pub revocations: Vec<Revocation>,
    /// The keys whose value the writes brought in (added, or a new value):
    /// a running server forgets having found them unknown
    /// ([`crate::auth::cache::Caches::forget_keys`]).
    #[serde(skip)]
    pub new_key_values: Vec<KeyDigest>,
}

impl Report {
    /// A short summary for people.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let verb = if self.dry_run { "would be " } else { "" };
        let mut out = String::new();
        if self.dry_run {
            out.push_str("dry run: nothing was written\n");
        }
        for (kind, counts) in [
            ("users", &self.users),
            ("API keys", &self.keys),
            ("second factors", &self.two_factors),
        ] {
            let _ = writeln!(
                out,
                "{kind}: {} {verb}added, {} {verb}updated, {} unchanged, {} skipped",
                counts.added, counts.updated, counts.unchanged, counts.skipped
            );
        }
        const SHOWN: usize = 20;
        for skipped in self.skipped.iter().take(SHOWN) {
            let _ = writeln!(
                out,
                "  skipped {} {} ({}): {}",
                skipped.kind, skipped.id, skipped.name, skipped.reason
            );
        }
        if self.skipped.len() > SHOWN {
            let _ = writeln!(
                out,
                "  ... and {} more skipped (--json lists them all)",
                self.skipped.len() - SHOWN
            );
        }
        let gone = self.users.deleted_on_platform + self.keys.deleted_on_platform;
        if gone > 0 {
            let removed = self.users.removed + self.keys.removed;
            let what = if removed > 0 {
                format!("{removed} {verb}removed from keygate")
            } else {
                "kept in keygate; --prune removes them".into()
            };
            let _ = writeln!(
                out,
                "deleted on the platform since the last import: {} users, {} API keys ({what})",
                self.users.deleted_on_platform, self.keys.deleted_on_platform
            );
        }
        let _ = writeln!(
            out,
            "public customers: {} {verb}stored",
            self.public_customers
        );
        if let Some(admin) = &self.bootstrap_admin {
            let _ = match admin.reason.as_deref() {
                None => writeln!(
                    out,
                    "bootstrap administrator {}: {verb}removed, the platform's administrator takes over",
                    admin.email
                ),
                Some(reason) => writeln!(
                    out,
                    "bootstrap administrator {}: kept: {reason}",
                    admin.email
                ),
            };
        }
        let issuer = self.signing.issuer.as_deref().unwrap_or("");
        let _ = match self.signing.state {
            "imported" => writeln!(out, "signing settings: {verb}imported (issuer {issuer})"),
            "unchanged" => writeln!(out, "signing settings: unchanged (issuer {issuer})"),
            "absent" => writeln!(out, "signing settings: none on the platform"),
            _ => writeln!(
                out,
                "signing settings: not imported: {}",
                self.signing.reason.as_deref().unwrap_or("")
            ),
        };
        out
    }
}

/// Imports from the platform's database into `store`. `progress` hears of
/// the rows read, for large databases. An error before anything is written
/// (the database unreachable or not the platform's) leaves the store as it
/// was; a row that cannot be imported is skipped, named and counted.
pub async fn run(
    store: &Store,
    options: &Options,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Report, ImportError> {
    let mut source = Source::open(&options.database_url).await?;
    let result = import(store, options, &mut source, progress).await;
    source.close().await;
    if let Ok(report) = &result
        && !options.dry_run
    {
        announce(store, options.origin, &report.skipped).await;
    }
    result
}

/// Imports from an open snapshot of the platform's database.
pub(crate) async fn import(
    store: &Store,
    options: &Options,
    source: &mut Source,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Report, ImportError> {
    source.check_schema().await?;
    let (user_total, key_total) = source.counts().await?;
    progress(&format!(
        "the platform holds {user_total} users and {key_total} API keys"
    ));
    let signing = signing(store, options.dry_run, source.jwt_settings().await?).await?;
    let mut run = Run::new(store, options, signing);
    run.collisions = email_collisions(source).await?;
    {
        let mut rows = pin!(source.users());
        let mut batch = Vec::with_capacity(BATCH);
        let mut read = 0_u64;
        while let Some(row) = rows.next().await {
            batch.push(row?);
            read += 1;
            if batch.len() == BATCH {
                run.users(std::mem::take(&mut batch)).await?;
            }
            if read.is_multiple_of(PROGRESS_EVERY) {
                progress(&format!("users: {read} of {user_total}"));
            }
        }
        run.users(batch).await?;
    }
    {
        let mut rows = pin!(source.keys());
        let mut batch = Vec::with_capacity(BATCH);
        let mut read = 0_u64;
        while let Some(row) = rows.next().await {
            batch.push(row?);
            read += 1;
            if batch.len() == BATCH {
                run.keys(std::mem::take(&mut batch)).await?;
            }
            if read.is_multiple_of(PROGRESS_EVERY) {
                progress(&format!("API keys: {read} of {key_total}"));
            }
        }
        run.keys(batch).await?;
    }
    // Older versions of the platform have no second factors to import.
    if source.has_two_fa().await? {
        {
            let mut rows = pin!(source.two_fa_settings());
            let mut batch = Vec::with_capacity(BATCH);
            while let Some(row) = rows.next().await {
                batch.push(row?);
                if batch.len() == BATCH {
                    run.two_factors(std::mem::take(&mut batch)).await?;
                }
            }
            run.two_factors(batch).await?;
        }
        run.two_factors_gone().await?;
    }
    run.deleted(options.prune).await?;
    run.bootstrap_admin().await?;
    let public = source.public_customers().await?;
    run.public_customers(public).await?;
    Ok(run.report)
}

/// Looks a token keygate does not know up in the platform's database
/// (an invitation's `activate_token` or a reset link's `reset_token`, by
/// `kind`) and, when a user holds it there, imports that user (or their new
/// token) by the rules of a re-import; returns the user's id. A link the
/// platform mailed then works at once, before the next sync.
pub async fn lookup_token(
    store: &Store,
    options: &Options,
    kind: TokenKind,
    token: &str,
) -> Result<Option<(Uuid, Vec<Revocation>)>, ImportError> {
    let mut source = Source::open(&options.database_url).await?;
    let result = lookup(store, options, &mut source, kind, token).await;
    source.close().await;
    result
}

async fn lookup(
    store: &Store,
    options: &Options,
    source: &mut Source,
    kind: TokenKind,
    token: &str,
) -> Result<Option<(Uuid, Vec<Revocation>)>, ImportError> {
    let Some(row) = source.user_by_token(kind, token).await? else {
        return Ok(None);
    };
    let absent = Signing {
        state: "absent",
        issuer: None,
        reason: None,
    };
    let mut run = Run::new(store, options, absent);
    run.collisions = email_collisions(source).await?;
    run.users(vec![row]).await?;
    announce(store, options.origin, &run.report.skipped).await;
    let Some(id) = run.seen_users.iter().next().copied() else {
        return Ok(None);
    };
    // Imported, or kept as keygate holds it: either way the token is the
    // user's only if keygate now holds it for them.
    let digest = KeyDigest::of(token).to_hex();
    let now_ms = crate::clock::now_ms();
    let holder = match kind {
        TokenKind::Activation => store.activation_user(&digest, now_ms).await?,
        TokenKind::Reset => match store.reset_token(&digest, now_ms).await? {
            crate::store::ResetToken::Valid(holder) => Some(holder),
            _ => None,
        },
    };
    Ok((holder == Some(id)).then_some((id, run.report.revocations)))
}

/// The signing key (Base64 text) and issuer of the platform's `jwt`
/// settings, or why keygate cannot sign with them.
fn signing_key_of(json: &str) -> Result<(String, String), String> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else {
        return Err("the jwt settings are not JSON".into());
    };
    let text = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_owned);
    let (Some(key), Some(issuer)) = (text("tokenSigningKey"), text("tokenIssuer")) else {
        return Err("the jwt settings lack tokenSigningKey or tokenIssuer".into());
    };
    // HS512 needs a key of at least 512 bits; the platform itself replaces a
    // shorter one at install and upgrade (`validateKeyLength`), so such a key
    // is not one it signs with, and keygate would refuse to start with it.
    match base64::engine::general_purpose::STANDARD.decode(&key) {
        Ok(bytes) if bytes.len() >= 64 => Ok((key, issuer)),
        Ok(bytes) if !bytes.is_empty() => Err(format!(
            "tokenSigningKey decodes to {} bits, fewer than the 512 HS512 needs",
            bytes.len() * 8
        )),
        _ => Err("tokenSigningKey is not base64".into()),
    }
}

/// `check-config --connect` on the platform's database: it is reachable,
/// has every table and column the import and the sync read, and its `jwt`
/// settings hold a signing key keygate can mint the platform's tokens with.
/// What is wrong, in one line, naming what is missing.
pub async fn check_platform_database(url: &str) -> Result<(), String> {
    let mut source = Source::open(url).await.map_err(|e| e.to_string())?;
    let checked = async {
        source.check_schema().await.map_err(|e| e.to_string())?;
        match source.jwt_settings().await.map_err(|e| e.to_string())? {
            None => Err("no signing key: admin_settings has no 'jwt' row".to_owned()),
            Some(json) => signing_key_of(&json).map(|_| ()).map_err(|reason| {
                format!("the signing key row ('jwt' in admin_settings): {reason}")
            }),
        }
    }
    .await;
    source.close().await;
    checked
}

/// A platform address as a report and a log show it: at most 100
/// characters, control characters escaped (a row may hold a CR LF).
fn shown_name(text: &str) -> String {
    let mut shown: String = text
        .chars()
        .take(100)
        .flat_map(char::escape_default)
        .collect();
    if text.chars().count() > 100 {
        shown.push_str("...");
    }
    shown
}

/// The addresses two or more platform users fold to ([`crate::email::fold`]),
/// each with the ids of those users. Such rows are all held back: which one
/// came first says nothing about who owns the address.
async fn email_collisions(
    source: &mut Source,
) -> Result<HashMap<String, Vec<String>>, ImportError> {
    let mut by_address: HashMap<String, Vec<String>> = HashMap::new();
    let mut rows = pin!(source.user_emails());
    while let Some(row) = rows.next().await {
        let (id, email) = row?;
        let folded = crate::email::fold(&email);
        if !folded.is_empty() {
            by_address.entry(folded).or_default().push(id);
        }
    }
    by_address.retain(|_, ids| ids.len() > 1);
    Ok(by_address)
}

/// Says what was held back: a warning in the log and an audit event
/// (`user.import_skipped`, `api_key.import_skipped`) for each user and key
/// row. The sync calls it with the rows new since its last round only.
pub async fn announce(store: &Store, origin: Origin, skipped: &[Skipped]) {
    for skipped in skipped {
        tracing::warn!(
            kind = skipped.kind,
            id = %skipped.id,
            reason = skipped.code,
            detail = %skipped.reason,
            "a platform row was not imported"
        );
        let Ok(id) = Uuid::parse_str(&skipped.id) else {
            continue;
        };
        let written = match skipped.kind {
            "user" => {
                store
                    .audited(origin.audit("user.import_skipped"))
                    .record_user_event(id)
                    .await
            }
            "API key" => {
                store
                    .audited(origin.audit("api_key.import_skipped"))
                    .record_key_event(id)
                    .await
            }
            _ => Ok(()),
        };
        if let Err(error) = written {
            tracing::error!(%error, "recording an audit event of a skipped platform row failed");
        }
    }
}

/// The platform's `jwt` settings into keygate's store.
async fn signing(
    store: &Store,
    dry_run: bool,
    json: Option<String>,
) -> Result<Signing, ImportError> {
    let invalid = |reason: &str| Signing {
        state: "invalid",
        issuer: None,
        reason: Some(reason.to_owned()),
    };
    let Some(json) = json else {
        return Ok(Signing {
            state: "absent",
            issuer: None,
            reason: None,
        });
    };
    let (key, issuer) = match signing_key_of(&json) {
        Ok(found) => found,
        Err(reason) => return Ok(invalid(&reason)),
    };
    let changed = if dry_run {
        store.platform_signing().await?.as_ref() != Some(&(key.clone(), issuer.clone()))
    } else {
        store.set_platform_signing(&key, &issuer).await?
    };
    Ok(Signing {
        state: if changed { "imported" } else { "unchanged" },
        issuer: Some(issuer),
        reason: None,
    })
}

struct Run {
    store: Store,
    users_store: Store,
    keys_store: Store,
    two_factor_store: Store,
    sealer: Arc<Sealer>,
    origin: Origin,
    dry_run: bool,
    mail: bool,
    now_ms: i64,
    report: Report,
    seen_users: HashSet<Uuid>,
    /// Users added by this run (in a dry run: that would be), with their
    /// e-mail addresses.
    added_users: HashMap<Uuid, String>,
    seen_keys: HashSet<Uuid>,
    /// Users whose second-factor settings the platform holds.
    seen_two_factors: HashSet<Uuid>,
    /// `login.max_bcrypt_cost`.
    max_bcrypt_cost: u32,
    /// Addresses several platform users fold to ([`email_collisions`]).
    collisions: HashMap<String, Vec<String>>,
    /// Whether this run adds (in a dry run: would add) a platform
    /// administrator who can log in.
    admin_added: bool,
}

const SECOND_FACTOR: &str = "second factor";

impl Run {
    fn new(store: &Store, options: &Options, signing: Signing) -> Run {
        let origin = options.origin;
        Run {
            store: store.clone(),
            users_store: store.audited(origin.audit("user.import")),
            keys_store: store.audited(origin.audit("api_key.import")),
            two_factor_store: store.audited(origin.audit("two_factor.import")),
            sealer: options.sealer.clone(),
            origin,
            dry_run: options.dry_run,
            mail: options.mail,
            now_ms: crate::clock::now_ms(),
            report: Report {
                dry_run: options.dry_run,
                users: Counts::default(),
                keys: Counts::default(),
                two_factors: Counts::default(),
                skipped: Vec::new(),
                deleted_users: Vec::new(),
                deleted_keys: Vec::new(),
                signing,
                public_customers: 0,
                bootstrap_admin: None,
                revocations: Vec::new(),
                new_key_values: Vec::new(),
            },
            seen_users: HashSet::new(),
            added_users: HashMap::new(),
            seen_keys: HashSet::new(),
            seen_two_factors: HashSet::new(),
            max_bcrypt_cost: options.max_bcrypt_cost,
            collisions: HashMap::new(),
            admin_added: false,
        }
    }

    /// Keeps the digest (hex, as stored) of a key value a write brought in.
    fn new_key_value(&mut self, digest: Option<&str>) {
        if let Some(digest) = digest.and_then(KeyDigest::from_hex) {
            self.report.new_key_values.push(digest);
        }
    }

    /// Keeps what a write published for the server to apply.
    fn published<T>(&mut self, change: Published<T>) {
        self.report.revocations.extend(change.revocation);
    }

    fn skip(&mut self, kind: &'static str, id: &str, name: &str, reason: String) {
        self.hold(kind, id, name, Refused::new(code::OTHER, reason));
    }

    /// Skips a row, naming why by code and in words.
    fn hold(&mut self, kind: &'static str, id: &str, name: &str, refused: Refused) {
        let counts = match kind {
            "user" => &mut self.report.users,
            SECOND_FACTOR => &mut self.report.two_factors,
            _ => &mut self.report.keys,
        };
        counts.skipped += 1;
        self.report.skipped.push(Skipped {
            kind,
            id: id.to_owned(),
            name: name.to_owned(),
            code: refused.code,
            reason: refused.reason,
        });
    }

    async fn users(&mut self, rows: Vec<UserRow>) -> Result<(), ImportError> {
        let mapped = self.map_users(rows).await?;
        // Who holds each address, in keygate and among the rows added here.
        let emails: Vec<String> = mapped.iter().map(|u| u.email.clone()).collect();
        let mut holders = self.store.user_ids_by_emails(&emails).await?;
        let mapped = self.without_collisions(mapped, &holders);
        let mapped = self.without_foreign_customers(mapped).await?;
        let adds = self.plan_users(mapped, &mut holders).await?;
        self.add_users(adds).await
    }

    /// The rows that map to users keygate can hold; the others are held
    /// back, and those of them the platform disabled are disabled in keygate
    /// ([`Run::disable_held_back`]).
    async fn map_users(&mut self, rows: Vec<UserRow>) -> Result<Vec<PlatformUser>, ImportError> {
        let mut mapped = Vec::with_capacity(rows.len());
        let mut disabled_there = Vec::new();
        for row in rows {
            if let Ok(id) = Uuid::parse_str(&row.id) {
                self.seen_users.insert(id);
                if row.enabled != Some(true) {
                    disabled_there.push(id);
                }
            }
            match plan::map_user(&row, self.now_ms, self.max_bcrypt_cost) {
                Ok(user) => {
                    disabled_there.retain(|id| *id != user.id);
                    mapped.push(user);
                }
                Err(refused) => {
                    let name = shown_name(row.email.as_deref().unwrap_or(""));
                    self.hold("user", &row.id, &name, refused);
                }
            }
        }
        self.disable_held_back(&disabled_there).await?;
        Ok(mapped)
    }

    /// `mapped` without the users whose address another row folds to too.
    /// Rows folding to one address are all held back, but for the one
    /// keygate already holds it for (imported before): it keeps the name,
    /// and the platform's changes to it (disabled, deleted) still apply.
    fn without_collisions(
        &mut self,
        mapped: Vec<PlatformUser>,
        holders: &HashMap<String, Uuid>,
    ) -> Vec<PlatformUser> {
        let mut clear = Vec::with_capacity(mapped.len());
        for user in mapped {
            let holds = holders.get(&user.email) == Some(&user.id);
            match self.collisions.get(&user.email).filter(|_| !holds) {
                Some(ids) => {
                    let id = user.id.to_string();
                    let others: Vec<&str> = ids
                        .iter()
                        .map(String::as_str)
                        .filter(|other| *other != id)
                        .collect();
                    let reason = match holders.get(&user.email) {
                        Some(holder) => format!(
                            "its e-mail address folds to {}, as platform user {} does; keygate holds it for user {holder}, who keeps it",
                            user.email,
                            others.join(", ")
                        ),
                        None => format!(
                            "its e-mail address folds to {}, as platform user {} does: all such rows are held back until one address names one user",
                            user.email,
                            others.join(", ")
                        ),
                    };
                    let refused = Refused::new(code::EMAIL_COLLISION, reason);
                    self.hold("user", &id, &user.email, refused);
                }
                None => clear.push(user),
            }
        }
        clear
    }

    /// `mapped` without the users whose customer keygate already binds to
    /// another tenant: that customer stays there.
    async fn without_foreign_customers(
        &mut self,
        mapped: Vec<PlatformUser>,
    ) -> Result<Vec<PlatformUser>, ImportError> {
        let mut owners: HashMap<Uuid, Option<Uuid>> = HashMap::new();
        let mut clear = Vec::with_capacity(mapped.len());
        for user in mapped {
            if user.customer_id != NULL_UUID {
                let owner = match owners.get(&user.customer_id) {
                    Some(owner) => *owner,
                    None => {
                        let owner = self.store.customer_tenant(user.customer_id).await?;
                        owners.insert(user.customer_id, owner);
                        owner
                    }
                };
                if let Some(owner) = owner.filter(|owner| *owner != user.tenant_id) {
                    let reason = format!(
                        "its customer {} belongs to tenant {owner} in keygate, not to its tenant {}",
                        user.customer_id, user.tenant_id
                    );
                    let refused = Refused::new(code::FOREIGN_CUSTOMER, reason);
                    self.hold("user", &user.id.to_string(), &user.email, refused);
                    continue;
                }
            }
            clear.push(user);
        }
        Ok(clear)
    }

    /// Compares each user with keygate's and with the row imported last,
    /// and applies what changed (not in a dry run); returns the users to
    /// add. `holders`: who holds each address, the users to add included.
    async fn plan_users(
        &mut self,
        mapped: Vec<PlatformUser>,
        holders: &mut HashMap<String, Uuid>,
    ) -> Result<Vec<PlatformUser>, ImportError> {
        let ids: Vec<Uuid> = mapped.iter().map(|u| u.id).collect();
        let keygate = self.store.users_by_ids(&ids).await?;
        let rehashed = self.store.rehashed_from_by_ids(&ids).await?;
        let imported: HashMap<Uuid, PlatformUser> =
            self.store.imported_rows(RowKind::User, &ids).await?;
        let owner = match self.origin {
            Origin::Sync => plan::PasswordOwner::Platform,
            Origin::CommandLine => plan::PasswordOwner::Keygate,
        };
        let mut adds = Vec::new();
        for user in mapped {
            let taken = holders
                .get(&user.email)
                .copied()
                .filter(|holder| *holder != user.id);
            let id = user.id;
            let rehashed_from = rehashed.get(&id).map(String::as_str);
            match plan::plan_user(
                user,
                keygate.get(&id),
                imported.get(&id),
                rehashed_from,
                owner,
            ) {
                Plan::Add(user) if let Some(holder) = taken => {
                    let reason =
                        format!("keygate user {holder} has this e-mail address, and keeps it");
                    let refused = Refused::new(code::EMAIL_TAKEN, reason);
                    self.hold("user", &id.to_string(), &user.email, refused);
                }
                Plan::Add(user) => {
                    holders.insert(user.email.clone(), id);
                    self.admin_added |= user.authority == crate::identity::Authority::SysAdmin
                        && user.enabled
                        && !user.password_hash.is_empty();
                    adds.push(user);
                }
                Plan::Update(user, update) if update.profile && taken.is_some() => {
                    let reason = "its new e-mail address is another keygate user's".to_owned();
                    let refused = Refused::new(code::EMAIL_TAKEN, reason);
                    self.hold("user", &id.to_string(), &user.email, refused);
                }
                Plan::Update(user, update) => {
                    if !self.dry_run {
                        let now_secs = self.now_ms / 1000;
                        let change = self
                            .users_store
                            .update_imported_user(&user, &update, now_secs)
                            .await?;
                        self.published(change);
                    }
                    self.report.users.updated += 1;
                }
                Plan::Keep { platform, remember } => {
                    self.remember_unchanged(RowKind::User, id, &platform, remember)
                        .await?;
                    self.report.users.unchanged += 1;
                }
                Plan::Skip(reason) => {
                    let name = keygate
                        .get(&id)
                        .map(|u| u.email.clone())
                        .unwrap_or_default();
                    self.skip("user", &id.to_string(), &name, reason);
                }
            }
        }
        Ok(adds)
    }

    /// Records the platform's row of an unchanged user or key when
    /// `remember` asks for it (not in a dry run).
    async fn remember_unchanged<T: Serialize>(
        &self,
        kind: RowKind,
        id: Uuid,
        platform: &T,
        remember: bool,
    ) -> Result<(), ImportError> {
        if remember && !self.dry_run {
            self.store
                .remember_imported(kind, id, platform, self.now_ms)
                .await?;
        }
        Ok(())
    }

    /// Adds the users planned (counts them only, in a dry run): in one
    /// batch, else one by one, naming the row that fails.
    async fn add_users(&mut self, adds: Vec<PlatformUser>) -> Result<(), ImportError> {
        self.added_users
            .extend(adds.iter().map(|u| (u.id, u.email.clone())));
        if self.dry_run || adds.is_empty() {
            self.report.users.added += adds.len() as u64;
            return Ok(());
        }
        if self
            .users_store
            .add_imported_users(&adds, self.now_ms)
            .await
            .is_ok()
        {
            self.report.users.added += adds.len() as u64;
            return Ok(());
        }
        // One row failed the batch: add them one by one, naming the bad one.
        for user in adds {
            match self
                .users_store
                .add_imported_users(std::slice::from_ref(&user), self.now_ms)
                .await
            {
                Ok(()) => self.report.users.added += 1,
                Err(error) => {
                    self.added_users.remove(&user.id);
                    self.skip("user", &user.id.to_string(), &user.email, error.to_string());
                }
            }
        }
        Ok(())
    }

    /// A row skipped now of a user imported before is not applied, but its
    /// platform's disabling is: a user disabled on the platform never stays
    /// enabled in keygate because their row broke a rule meanwhile. The
    /// import record follows, so that enabling them on the platform again
    /// applies once their row imports.
    async fn disable_held_back(&mut self, ids: &[Uuid]) -> Result<(), ImportError> {
        if ids.is_empty() {
            return Ok(());
        }
        let imported: HashMap<Uuid, PlatformUser> =
            self.store.imported_rows(RowKind::User, ids).await?;
        let keygate = self.store.users_by_ids(ids).await?;
        for (id, mut platform) in imported {
            if !keygate.get(&id).is_some_and(|user| user.enabled) {
                continue;
            }
            tracing::warn!(user_id = %id, "a platform row held back is disabled on the platform: disabled in keygate too");
            if self.dry_run {
                continue;
            }
            let change = self
                .users_store
                .set_user_enabled(id, false, self.now_ms / 1000)
                .await?;
            self.published(change);
            platform.enabled = false;
            self.store
                .remember_imported(RowKind::User, id, &platform, self.now_ms)
                .await?;
        }
        Ok(())
    }

    async fn keys(&mut self, rows: Vec<KeyRow>) -> Result<(), ImportError> {
        let mapped = self.map_keys(rows);
        let adds = self.plan_keys(mapped).await?;
        self.add_keys(adds).await
    }

    /// The rows that map to keys keygate can hold; the others are skipped.
    fn map_keys(&mut self, rows: Vec<KeyRow>) -> Vec<PlatformKey> {
        let mut mapped = Vec::with_capacity(rows.len());
        for row in rows {
            if let Ok(id) = Uuid::parse_str(&row.id) {
                self.seen_keys.insert(id);
            }
            match plan::map_key(&row) {
                Ok(key) => mapped.push(key),
                Err(reason) => {
                    let name = row.description.as_deref().unwrap_or("");
                    self.skip("API key", &row.id, name, reason);
                }
            }
        }
        mapped
    }

    /// Compares each key with keygate's and with the row imported last, and
    /// applies what changed (not in a dry run); returns the keys to add: of
    /// an owner in keygate (or added by this run), and of a value no other
    /// key has.
    async fn plan_keys(
        &mut self,
        mapped: Vec<PlatformKey>,
    ) -> Result<Vec<PlatformKey>, ImportError> {
        let ids: Vec<Uuid> = mapped.iter().map(|k| k.id).collect();
        let owner_ids: Vec<Uuid> = mapped.iter().map(|k| k.user_id).collect();
        let digests: Vec<String> = mapped.iter().map(|k| k.digest.clone()).collect();
        let keygate = self.store.api_keys_by_ids(&ids).await?;
        let imported: HashMap<Uuid, PlatformKey> =
            self.store.imported_rows(RowKind::Key, &ids).await?;
        let owners = self.store.users_by_ids(&owner_ids).await?;
        let mut holders = self.store.api_key_ids_by_digests(&digests).await?;
        let mut adds = Vec::new();
        for key in mapped {
            let id = key.id;
            let taken = holders.get(&key.digest).is_some_and(|holder| *holder != id);
            let owned =
                owners.contains_key(&key.user_id) || self.added_users.contains_key(&key.user_id);
            match plan::plan_key(key, keygate.get(&id), imported.get(&id)) {
                Plan::Add(key) if !owned => {
                    let reason = format!("its owner {} is not in keygate", key.user_id);
                    self.skip("API key", &id.to_string(), &key.description, reason);
                }
                Plan::Add(key) if taken => {
                    let reason = "its value is another keygate key's".to_owned();
                    self.skip("API key", &id.to_string(), &key.description, reason);
                }
                Plan::Add(key) => {
                    holders.insert(key.digest.clone(), id);
                    adds.push(key);
                }
                Plan::Update(key, update) if update.digest.is_some() && taken => {
                    let reason = "its new value is another keygate key's".to_owned();
                    self.skip("API key", &id.to_string(), &key.description, reason);
                }
                Plan::Update(key, update) => {
                    if !self.dry_run {
                        let change = self
                            .keys_store
                            .update_imported_key(&key, &update, self.now_ms)
                            .await?;
                        self.published(change);
                        self.new_key_value(update.digest.as_deref());
                    }
                    self.report.keys.updated += 1;
                }
                Plan::Keep { platform, remember } => {
                    self.remember_unchanged(RowKind::Key, id, &platform, remember)
                        .await?;
                    self.report.keys.unchanged += 1;
                }
                Plan::Skip(reason) => {
                    let name = keygate
                        .get(&id)
                        .map(|k| k.description.clone())
                        .unwrap_or_default();
                    self.skip("API key", &id.to_string(), &name, reason);
                }
            }
        }
        Ok(adds)
    }

    /// Adds the keys planned (counts them only, in a dry run): in one batch,
    /// else one by one, naming the row that fails.
    async fn add_keys(&mut self, adds: Vec<PlatformKey>) -> Result<(), ImportError> {
        if self.dry_run || adds.is_empty() {
            self.report.keys.added += adds.len() as u64;
            return Ok(());
        }
        if self
            .keys_store
            .add_imported_keys(&adds, self.now_ms)
            .await
            .is_ok()
        {
            self.report.keys.added += adds.len() as u64;
            for key in &adds {
                self.new_key_value(Some(&key.digest));
            }
            return Ok(());
        }
        for key in adds {
            match self
                .keys_store
                .add_imported_keys(std::slice::from_ref(&key), self.now_ms)
                .await
            {
                Ok(()) => {
                    self.report.keys.added += 1;
                    self.new_key_value(Some(&key.digest));
                }
                Err(error) => {
                    self.skip(
                        "API key",
                        &key.id.to_string(),
                        &key.description,
                        error.to_string(),
                    );
                }
            }
        }
        Ok(())
    }

    async fn two_factors(&mut self, rows: Vec<TwoFaRow>) -> Result<(), ImportError> {
        let mut users = Vec::with_capacity(rows.len());
        for row in rows {
            let Ok(user_id) = Uuid::parse_str(&row.user_id) else {
                let reason = format!("bad user id {:?}", row.user_id);
                self.skip(SECOND_FACTOR, &row.user_id, "", reason);
                continue;
            };
            self.seen_two_factors.insert(user_id);
            users.push((user_id, row.two_fa_settings.unwrap_or_default()));
        }
        let ids: Vec<Uuid> = users.iter().map(|(id, _)| *id).collect();
        let keygate = self.store.users_by_ids(&ids).await?;
        let imported: HashMap<Uuid, TwoFactorMemory> =
            self.store.imported_rows(RowKind::TwoFactor, &ids).await?;
        for (user_id, json) in users {
            let email = keygate
                .get(&user_id)
                .map(|u| u.email.clone())
                .or_else(|| self.added_users.get(&user_id).cloned());
            let (mapped, refused) = if json.trim().is_empty() {
                (Vec::new(), Vec::new())
            } else {
                plan::map_two_factors(&json, email.as_deref().unwrap_or(""), self.mail)
            };
            if email.is_none() {
                if !mapped.is_empty() {
                    let reason = format!("its user {user_id} is not in keygate");
                    self.skip(SECOND_FACTOR, &user_id.to_string(), "", reason);
                }
                continue;
            }
            let email = email.unwrap_or_default();
            for (provider, reason) in refused {
                let reason = format!("{provider}: {reason}");
                self.skip(SECOND_FACTOR, &user_id.to_string(), &email, reason);
            }
            let memory = imported.get(&user_id).cloned().unwrap_or_default();
            self.two_factor_user(user_id, &email, &mapped, memory)
                .await?;
        }
        Ok(())
    }

    /// Users whose second factors were imported and whose settings the
    /// platform no longer holds: as if they had none.
    async fn two_factors_gone(&mut self) -> Result<(), ImportError> {
        let gone = self
            .store
            .imported_ids_not_in(RowKind::TwoFactor, &self.seen_two_factors)
            .await?;
        let imported: HashMap<Uuid, TwoFactorMemory> =
            self.store.imported_rows(RowKind::TwoFactor, &gone).await?;
        for user_id in gone {
            let memory = imported.get(&user_id).cloned().unwrap_or_default();
            self.two_factor_user(user_id, "", &[], memory).await?;
        }
        Ok(())
    }

    /// Applies [`plan::plan_two_factor`] to each provider of one user and
    /// records what was imported.
    async fn two_factor_user(
        &mut self,
        user_id: Uuid,
        email: &str,
        platform: &[PlatformTwoFactor],
        memory: TwoFactorMemory,
    ) -> Result<(), ImportError> {
        let times = self.store.two_factor_times(user_id).await?;
        let mut remembered = TwoFactorMemory::new();
        for provider in ["TOTP", "EMAIL", "BACKUP_CODE"] {
            let config = platform.iter().find(|f| f.provider == provider);
            let fingerprint =
                config.map(|f| self.sealer.code_digest(user_id, &f.secret.canonical()));
            let before = memory.get(provider);
            let decided =
                plan::plan_two_factor(fingerprint.as_deref(), times.get(provider).copied(), before);
            match (decided, config, fingerprint) {
                (TwoFactorPlan::Add | TwoFactorPlan::Replace, Some(config), Some(fingerprint)) => {
                    let Some(record) = self.record_of(user_id, config) else {
                        let reason = format!("{provider}: the secret could not be sealed");
                        self.skip(SECOND_FACTOR, &user_id.to_string(), email, reason);
                        continue;
                    };
                    if !self.dry_run {
                        let change = self
                            .two_factor_store
                            .put_imported_two_factor(user_id, &record, self.now_ms)
                            .await?;
                        self.published(change);
                    }
                    remembered.insert(
                        provider.to_owned(),
                        ImportedTwoFactor {
                            fingerprint,
                            created_time: self.now_ms,
                        },
                    );
                    if decided == TwoFactorPlan::Add {
                        self.report.two_factors.added += 1;
                    } else {
                        self.report.two_factors.updated += 1;
                    }
                }
                (TwoFactorPlan::Remove, _, _) => {
                    self.report.two_factors.deleted_on_platform += 1;
                    self.report.two_factors.removed += 1;
                    if !self.dry_run {
                        let change = self
                            .two_factor_store
                            .remove_two_factor(user_id, provider, self.now_ms)
                            .await?;
                        self.published(change);
                    }
                }
                (TwoFactorPlan::Forget, _, _) => {
                    self.report.two_factors.deleted_on_platform += 1;
                }
                (TwoFactorPlan::Keep, _, _) => {
                    if let Some(before) = before {
                        remembered.insert(provider.to_owned(), before.clone());
                    }
                    self.report.two_factors.unchanged += 1;
                }
                _ => {}
            }
        }
        if self.dry_run || remembered == memory {
            return Ok(());
        }
        if remembered.is_empty() {
            self.store
                .forget_imported(RowKind::TwoFactor, user_id)
                .await?;
        } else {
            self.store
                .remember_imported(RowKind::TwoFactor, user_id, &remembered, self.now_ms)
                .await?;
        }
        Ok(())
    }

    /// The keygate record of a platform second factor: the TOTP secret
    /// sealed, the backup codes as keyed digests, the EMAIL address as the
    /// EMAIL provider keeps it.
    fn record_of(&self, user_id: Uuid, config: &PlatformTwoFactor) -> Option<TwoFactorRecord> {
        let secret = match &config.secret {
            PlatformSecret::Totp(raw) => self.sealer.seal(user_id, config.provider, raw).ok()?,
            PlatformSecret::Codes(codes) => {
                let digests: Vec<String> = codes
                    .iter()
                    .map(|code| self.sealer.code_digest(user_id, code))
                    .collect();
                serde_json::to_string(&digests).ok()?
            }
            PlatformSecret::Email(email) => email.clone(),
        };
        Some(TwoFactorRecord {
            provider: config.provider.to_owned(),
            use_by_default: config.use_by_default,
            secret,
            last_step: 0,
        })
    }

    /// Reports what was imported and is gone from the platform; removes it
    /// with `prune` (keys first: a removed user takes their keys along).
    /// Replaces the stored public customers with the platform's; a row
    /// without a usable id or tenant is skipped, named and counted.
    async fn public_customers(
        &mut self,
        rows: Vec<(String, Option<String>)>,
    ) -> Result<(), ImportError> {
        let mut customers = Vec::with_capacity(rows.len());
        for (id, tenant) in rows {
            let customer_id = Uuid::parse_str(&id).ok();
            let tenant_id = tenant
                .as_deref()
                .and_then(|t| Uuid::parse_str(t).ok())
                .filter(|t| *t != NULL_UUID);
            match (customer_id, tenant_id) {
                (Some(customer_id), Some(tenant_id)) => customers.push(PublicCustomer {
                    customer_id,
                    tenant_id,
                }),
                _ => self.report.skipped.push(Skipped {
                    kind: "public customer",
                    id,
                    name: String::new(),
                    code: code::INVALID_ROW,
                    reason: if customer_id.is_none() {
                        "its id is not a UUID".into()
                    } else {
                        "it has no tenant".into()
                    },
                }),
            }
        }
        self.report.public_customers = customers.len() as u64;
        if !self.dry_run {
            self.store
                .replace_public_customers(&customers, self.now_ms)
                .await?;
        }
        Ok(())
    }

    /// Removes the bootstrap administrator once an administrator imported
    /// from the platform can log in, unless it has been used (then it is
    /// kept, and the report says so and why). A removal is audited
    /// (`user.bootstrap_remove`).
    async fn bootstrap_admin(&mut self) -> Result<(), ImportError> {
        let email = crate::accounts::BOOTSTRAP_EMAIL;
        let Some(admin) = self.store.user_by_email(email).await? else {
            return Ok(());
        };
        if admin.authority != crate::identity::Authority::SysAdmin
            || self.seen_users.contains(&admin.id)
        {
            return Ok(());
        }
        let imported: HashMap<Uuid, PlatformUser> =
            self.store.imported_rows(RowKind::User, &[admin.id]).await?;
        if !imported.is_empty() {
            return Ok(());
        }
        let successor =
            (self.dry_run && self.admin_added) || self.store.imported_admin_can_log_in().await?;
        if !successor {
            return Ok(());
        }
        let uses = self.store.uses_of(admin.id, admin.version).await?;
        if !uses.is_empty() {
            self.report.bootstrap_admin = Some(BootstrapAdmin {
                email: admin.email,
                state: "kept",
                reason: Some(format!(
                    "it has been used ({}); delete it with `keygate user delete {email}` once it is not needed",
                    uses.join(", ")
                )),
            });
            return Ok(());
        }
        if !self.dry_run {
            let change = self
                .store
                .audited(self.origin.audit("user.bootstrap_remove"))
                .delete_user(admin.id)
                .await?;
            self.published(change);
        }
        self.report.bootstrap_admin = Some(BootstrapAdmin {
            email: admin.email,
            state: "removed",
            reason: None,
        });
        Ok(())
    }

    async fn deleted(&mut self, prune: bool) -> Result<(), ImportError> {
        let keys = self
            .store
            .imported_ids_not_in(RowKind::Key, &self.seen_keys)
            .await?;
        let users = self
            .store
            .imported_ids_not_in(RowKind::User, &self.seen_users)
            .await?;
        self.report.keys.deleted_on_platform = keys.len() as u64;
        self.report.users.deleted_on_platform = users.len() as u64;
        if prune {
            self.report.keys.removed = keys.len() as u64;
            self.report.users.removed = users.len() as u64;
            if !self.dry_run {
                let keys_store = self.store.audited(self.origin.audit("api_key.prune"));
                for id in &keys {
                    let change = keys_store.delete_api_key(*id).await?;
                    self.published(change);
                    self.store.forget_imported(RowKind::Key, *id).await?;
                }
                let users_store = self.store.audited(self.origin.audit("user.prune"));
                for id in &users {
                    let change = users_store.delete_user(*id).await?;
                    self.published(change);
                    self.store.forget_imported(RowKind::User, *id).await?;
                }
            }
        }
        self.report.deleted_keys = keys;
        self.report.deleted_users = users;
        Ok(())
    }
}
