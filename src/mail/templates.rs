//! The messages keygate sends: the platform's wording by default, or an
//! operator's file (`[mail] *_template`), with `${name}` placeholders.

use crate::config::{MailSettings, MailTemplate};

/// Which message: its metric label, and which values its template may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MailKind {
    /// An invitation: `${activationLink}`, `${activationLinkTtlInHours}`.
    Activation,
    /// A password reset link: `${passwordResetLink}`,
    /// `${passwordResetLinkTtlInHours}`.
    Reset,
    /// The notice that a password was reset: `${loginLink}`.
    PasswordWasReset,
    /// An e-mail verification code: `${code}`, `${expirationTimeSeconds}`.
    Code,
}

impl MailKind {
    /// The `kind` label of `keygate_mail_sent_total`.
    pub fn label(self) -> &'static str {
        match self {
            MailKind::Activation => "activation",
            MailKind::Reset => "reset",
            MailKind::PasswordWasReset => "password_reset",
            MailKind::Code => "code",
        }
    }
}

const ACTIVATION_SUBJECT: &str = "Your account activation on Thingsboard";
const ACTIVATION_BODY: &str = "Activate your Thingsboard account

To confirm your email address and choose a password, just click the link below. The link will expire in ${activationLinkTtlInHours} hours.

We may need to send you critical information about our service and it is important that we have an accurate email address.

Activate your account:
${activationLink}

-- The Thingsboard

This email was sent to ${targetEmail} by Thingsboard.
";

const RESET_SUBJECT: &str = "Thingsboard - Password reset has been requested";
const RESET_BODY: &str = "Password reset has been requested

You have requested password reset for your Thingsboard account.
Click below in order to proceed password reset procedure. The link will expire in ${passwordResetLinkTtlInHours} hours.

Reset password:
${passwordResetLink}

-- The Thingsboard

This email was sent to ${targetEmail} by Thingsboard.
";

const PASSWORD_WAS_RESET_SUBJECT: &str = "Thingsboard - your account password has been reset";
const PASSWORD_WAS_RESET_BODY: &str = "Your Thingsboard account password has been reset

You have successfully created new password for your Thingsboard account.
Now you can login to your Thingsboard space using your newly created password.

Login:
${loginLink}

-- The Thingsboard

This email was sent to ${targetEmail} by Thingsboard.
";

const CODE_SUBJECT: &str = "ThingsBoard - 2FA verification code";
const CODE_BODY: &str = "Your verification code:

${code}

Please verify your access using the code above.
This code will expire in ${expirationTimeSeconds} seconds.

If you didn't request this code, you can ignore this email.

-- The Thingsboard

This email was sent to ${targetEmail} by Thingsboard.
";

/// The four messages in force.
#[derive(Debug, Clone)]
pub struct Templates {
    activation: MailTemplate,
    reset: MailTemplate,
    password_was_reset: MailTemplate,
    code: MailTemplate,
}

fn default(subject: &str, body: &str) -> MailTemplate {
    MailTemplate {
        subject: subject.to_string(),
        body: body.to_string(),
    }
}

impl Templates {
    pub fn new(settings: &MailSettings) -> Templates {
        let pick = |custom: &Option<MailTemplate>, subject, body| {
            custom.clone().unwrap_or_else(|| default(subject, body))
        };
        Templates {
            activation: pick(
                &settings.activation_template,
                ACTIVATION_SUBJECT,
                ACTIVATION_BODY,
            ),
            reset: pick(&settings.reset_template, RESET_SUBJECT, RESET_BODY),
            password_was_reset: pick(
                &settings.password_reset_template,
                PASSWORD_WAS_RESET_SUBJECT,
                PASSWORD_WAS_RESET_BODY,
            ),
            code: pick(&settings.code_template, CODE_SUBJECT, CODE_BODY),
        }
    }

    /// The subject and body of `kind` for `to`, with `values` (and
    /// `${targetEmail}`) put in. A placeholder without a value stays as
    /// written.
    pub fn render(&self, kind: MailKind, to: &str, values: &[(&str, &str)]) -> (String, String) {
        let template = match kind {
            MailKind::Activation => &self.activation,
            MailKind::Reset => &self.reset,
            MailKind::PasswordWasReset => &self.password_was_reset,
            MailKind::Code => &self.code,
        };
        let fill = |text: &str| {
            let mut out = text.replace("${targetEmail}", to);
            for (name, value) in values {
                out = out.replace(&format!("${{{name}}}"), value);
            }
            out
        };
        (fill(&template.subject), fill(&template.body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> MailSettings {
        let mut source = crate::config::Source {
            file: None,
            env: vec![],
        };
        source
            .env
            .push(("KEYGATE_MAIL_HOST".into(), "127.0.0.1".into()));
        source.env.push(("KEYGATE_MAIL_TLS".into(), "none".into()));
        source.env.push((
            "KEYGATE_MAIL_FROM".into(),
            "keygate <noreply@example.com>".into(),
        ));
        crate::config::load(&source).unwrap().mail.unwrap()
    }

    #[test]
    fn defaults_carry_the_platforms_wording_and_the_values() {
        let templates = Templates::new(&settings());
        let (subject, body) = templates.render(
            MailKind::Reset,
            "ann@example.com",
            &[
                (
                    "passwordResetLink",
                    "https://gw/api/noauth/resetPassword?resetToken=t",
                ),
                ("passwordResetLinkTtlInHours", "1"),
            ],
        );
        assert_eq!(subject, "Thingsboard - Password reset has been requested");
        assert!(body.contains("The link will expire in 1 hours."), "{body}");
        assert!(body.contains("https://gw/api/noauth/resetPassword?resetToken=t"));
        assert!(body.contains("This email was sent to ann@example.com"));
        assert!(!body.contains("${"), "{body}");
    }

    #[test]
    fn an_operator_template_replaces_the_default() {
        let mut settings = settings();
        settings.code_template = Some(MailTemplate {
            subject: "Code for ${targetEmail}".into(),
            body: "Use ${code} within ${expirationTimeSeconds}s.".into(),
        });
        let (subject, body) = Templates::new(&settings).render(
            MailKind::Code,
            "bob@example.com",
            &[("code", "123456"), ("expirationTimeSeconds", "120")],
        );
        assert_eq!(subject, "Code for bob@example.com");
        assert_eq!(body, "Use 123456 within 120s.");
    }
}
