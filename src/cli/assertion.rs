//! `keygate assertion ...`: the keys that sign identity assertions to
//! upstreams. Never prints a private key.

use anyhow::bail;

use keygate::config::Settings;
use keygate::identity::assertion::ring;

use super::{AssertionCommand, cli, open_store};

pub(super) async fn assertion(cmd: AssertionCommand, settings: &Settings) -> anyhow::Result<()> {
    let store = open_store(settings).await?;
    match cmd {
        AssertionCommand::Rotate { algorithm } => {
            if let Some(file) = &settings.assertion.signing_key_file {
                bail!(
                    "the signing key comes from assertion.signing_key_file ({}): to rotate, \
                     point the setting at a new key file and restart each replica",
                    file.display()
                );
            }
            let algorithm = algorithm.unwrap_or(settings.assertion.algorithm);
            let rotated = ring::rotate(&cli(&store, "signing_key.rotate"), algorithm).await?;
            match &rotated.retired {
                Some(old) => eprintln!(
                    "key {old} retired; it stays in the JWKS for {}s, while assertions it signed can live",
                    ring::publish_grace(&settings.assertion).as_secs()
                ),
                None => eprintln!("no key was current"),
            }
            eprintln!(
                "every replica signs with the new key within {}s",
                ring::reload_interval(&settings.assertion).as_secs()
            );
            println!("{}", rotated.current);
        }
        AssertionCommand::Keys => {
            for key in store.signing_keys().await? {
                let state = if key.retired_time == 0 {
                    "current".to_string()
                } else {
                    format!("retired {}", key.retired_time)
                };
                let place = if key.private_key.is_empty() {
                    "  (key file)"
                } else {
                    ""
                };
                println!(
                    "{}  {:<5}  created {}  {}{}",
                    key.kid, key.algorithm, key.created_time, state, place
                );
            }
        }
    }
    Ok(())
}
