//! Outgoing mail: a bounded queue that requests put messages on without
//! waiting, and one worker that sends them over SMTP (`lettre`, rustls) with
//! retries and a growing backoff. A full queue drops the message and a
//! message that cannot be sent ends in a dead-letter log line; both are
//! counted (`keygate_mail_sent_total`). No endpoint ever waits for a mail
//! server: one that is down or slow costs the request nothing.

mod templates;

pub use templates::{MailKind, Templates};

use std::sync::Arc;
use std::time::Duration;

use lettre::message::Mailbox;
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use tokio::sync::mpsc;

use crate::config::{MailSettings, MailTls};
use crate::telemetry::Metrics;

/// Longest wait between two attempts, however many retries are configured.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// One message on its way.
struct Outgoing {
    kind: MailKind,
    to: Mailbox,
    subject: String,
    body: String,
}

/// Why a mailer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error("mail.from: {0}")]
    From(String),
    #[error("mail TLS for {host:?}: {error}")]
    Tls { host: String, error: String },
}

/// The sending half: cheap to share, never blocks.
#[derive(Clone)]
pub struct Mailer {
    queue: mpsc::Sender<Outgoing>,
    templates: Templates,
    metrics: Arc<Metrics>,
    /// Lifetime of a password reset link (`[mail] reset_link_lifetime`).
    pub reset_link_lifetime: Duration,
    /// Lifetime of an e-mail code (`[mail] code_lifetime`).
    pub code_lifetime: Duration,
}

impl std::fmt::Debug for Mailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailer").finish_non_exhaustive()
    }
}

impl Mailer {
    /// Builds the SMTP transport and starts the worker on the current runtime.
    pub fn start(settings: &MailSettings, metrics: Arc<Metrics>) -> Result<Mailer, MailError> {
        let from: Mailbox = settings
            .from
            .parse()
            .map_err(|e: lettre::address::AddressError| MailError::From(e.to_string()))?;
        let transport = transport(settings)?;
        let (queue, receiver) = mpsc::channel(settings.queue_size);
        metrics.mail.init();
        let worker = Worker {
            transport,
            from,
            metrics: metrics.clone(),
            retries: settings.retries,
            backoff: settings.retry_backoff,
        };
        tokio::spawn(worker.run(receiver));
        Ok(Mailer {
            queue,
            templates: Templates::new(settings),
            metrics,
            reset_link_lifetime: settings.reset_link_lifetime,
            code_lifetime: settings.code_lifetime,
        })
    }

    /// Renders `kind` for `to` and queues it; never waits. `false` when the
    /// message was not queued (a bad address, a full queue): counted and
    /// logged, the caller's answer does not change.
    pub fn send(&self, kind: MailKind, to: &str, values: &[(&str, &str)]) -> bool {
        let Ok(mailbox) = to.parse::<Mailbox>() else {
            tracing::warn!(target: "keygate::mail", kind = kind.label(), to = %redact(to), "not an address mail can be sent to");
            self.metrics.mail.sent(kind.label(), "dead_letter");
            return false;
        };
        let (subject, body) = self.templates.render(kind, to, values);
        let message = Outgoing {
            kind,
            to: mailbox,
            subject,
            body,
        };
        match self.queue.try_send(message) {
            Ok(()) => {
                let waiting = self.queue.max_capacity() - self.queue.capacity();
                self.metrics.mail.queue_depth.set(waiting as i64);
                true
            }
            Err(_) => {
                self.metrics.mail.sent(kind.label(), "dropped");
                tracing::error!(target: "keygate::mail", kind = kind.label(), to = %redact(to), "mail queue full: message dropped");
                false
            }
        }
    }
}

fn transport(settings: &MailSettings) -> Result<AsyncSmtpTransport<Tokio1Executor>, MailError> {
    let tls_parameters = || {
        TlsParameters::new(settings.host.clone()).map_err(|error| MailError::Tls {
            host: settings.host.clone(),
            error: error.to_string(),
        })
    };
    let tls = match settings.tls {
        MailTls::StartTls => Tls::Required(tls_parameters()?),
        MailTls::Tls => Tls::Wrapper(tls_parameters()?),
        MailTls::None => Tls::None,
    };
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&settings.host)
        .port(settings.port)
        .tls(tls)
        .timeout(Some(settings.timeout));
    if let Some((user, password)) = &settings.credentials {
        builder = builder.credentials(Credentials::new(user.clone(), password.clone()));
    }
    Ok(builder.build())
}

struct Worker {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    metrics: Arc<Metrics>,
    retries: u32,
    backoff: Duration,
}

impl Worker {
    async fn run(self, mut receiver: mpsc::Receiver<Outgoing>) {
        while let Some(message) = receiver.recv().await {
            self.metrics.mail.queue_depth.set(receiver.len() as i64);
            self.deliver(message).await;
        }
    }

    /// Sends one message, retrying what may pass later; a permanent refusal
    /// or the last failed attempt ends in the dead-letter line.
    async fn deliver(&self, outgoing: Outgoing) {
        let kind = outgoing.kind.label();
        let to = redact(outgoing.to.email.as_ref());
        let message = match Message::builder()
            .from(self.from.clone())
            .to(outgoing.to.clone())
            .subject(outgoing.subject)
            .header(ContentType::TEXT_PLAIN)
            .body(outgoing.body)
        {
            Ok(message) => message,
            Err(error) => {
                self.metrics.mail.sent(kind, "dead_letter");
                tracing::error!(target: "keygate::mail", kind, to = %to, %error, "mail dead-lettered: the message could not be built");
                return;
            }
        };
        let mut wait = self.backoff;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let error = match self.transport.send(message.clone()).await {
                Ok(_) => {
                    self.metrics.mail.sent(kind, "sent");
                    tracing::info!(target: "keygate::mail", kind, to = %to, attempt, "mail sent");
                    return;
                }
                Err(error) => error,
            };
            if error.is_permanent() || attempt > self.retries {
                self.metrics.mail.sent(kind, "dead_letter");
                tracing::error!(target: "keygate::mail", kind, to = %to, attempts = attempt, error = %error, "mail dead-lettered: not sent");
                return;
            }
            self.metrics.mail.sent(kind, "retried");
            tracing::warn!(target: "keygate::mail", kind, to = %to, attempt, error = %error, retry_in = ?wait, "mail not sent; will retry");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_BACKOFF);
        }
    }
}

/// An address as logs show it: the first character of the local part and
/// the domain (`a***@example.com`), enough to tell messages apart, not to
/// harvest addresses.
pub fn redact(address: &str) -> String {
    match address.rsplit_once('@') {
        Some((local, domain)) => {
            let first: String = local.chars().take(1).collect();
            format!("{first}***@{domain}")
        }
        None => "***".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_addresses_keep_one_letter_and_the_domain() {
        assert_eq!(redact("alice@example.com"), "a***@example.com");
        assert_eq!(redact("@example.com"), "***@example.com");
        assert_eq!(redact("no-at-sign"), "***");
    }
}
