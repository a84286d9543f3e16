//! Reading a password: asked for without echo at a terminal, else the first
//! line of standard input.

use std::io::BufRead;

use anyhow::{Context, bail};

/// Reads a new password: at a terminal it is asked for on standard error and
/// typed without echo (twice when `confirm`); otherwise it is the first line
/// of standard input.
pub(super) async fn read_password(confirm: bool) -> anyhow::Result<String> {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        return first_line(std::io::stdin().lock());
    }
    let password = hidden("Password: ").await?;
    if confirm && hidden("Repeat the password: ").await? != password {
        bail!("the passwords do not match; nothing was changed");
    }
    // Asking took over Ctrl-C; it still ends the command from here on.
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(130);
        }
    });
    Ok(password)
}

/// The first line of `input` without its line ending; an input that ends
/// before any line is an error that says where the password is expected.
fn first_line(mut input: impl BufRead) -> anyhow::Result<String> {
    let mut line = String::new();
    let read = input
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    if read == 0 {
        bail!(
            "no password given: it is read from the first line of standard input \
             (or asked for when standard input is a terminal)"
        );
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

use std::io::Write;

/// Shows `prompt` on standard error and reads one line from the terminal
/// on standard input with echo turned off; echo comes back afterwards,
/// also when the read is interrupted with Ctrl-C.
#[cfg(unix)]
pub async fn hidden(prompt: &str) -> anyhow::Result<String> {
    use tokio::signal::unix::{SignalKind, signal};
    // Listening before echo goes off: Ctrl-C never leaves it off.
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for Ctrl-C")?;
    let echo = EchoOff::new()?;
    show(prompt);
    tokio::select! {
        line = tokio::task::spawn_blocking(read_line) => {
            drop(echo);
            line.context("reading the password")?
        }
        _ = interrupt.recv() => {
            drop(echo);
            eprintln!();
            std::process::exit(130);
        }
    }
}

/// Elsewhere the password is read as typed.
#[cfg(not(unix))]
pub async fn hidden(prompt: &str) -> anyhow::Result<String> {
    show(prompt);
    read_line()
}

fn show(prompt: &str) {
    let mut stderr = std::io::stderr();
    let _ = stderr.write_all(prompt.as_bytes());
    let _ = stderr.flush();
}

fn read_line() -> anyhow::Result<String> {
    let mut line = String::new();
    let read = std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the password")?;
    if read == 0 {
        eprintln!();
        bail!("no password entered");
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// Terminal echo turned off (the line break still shows) until dropped.
#[cfg(unix)]
struct EchoOff(rustix::termios::Termios);

#[cfg(unix)]
impl EchoOff {
    fn new() -> anyhow::Result<EchoOff> {
        use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let saved = tcgetattr(&stdin).context("reading the terminal settings")?;
        let mut quiet = saved.clone();
        quiet.local_modes.remove(LocalModes::ECHO);
        quiet.local_modes.insert(LocalModes::ECHONL);
        tcsetattr(&stdin, OptionalActions::Now, &quiet).context("turning the terminal echo off")?;
        Ok(EchoOff(saved))
    }
}

#[cfg(unix)]
impl Drop for EchoOff {
    fn drop(&mut self) {
        use rustix::termios::{OptionalActions, tcsetattr};
        let _ = tcsetattr(std::io::stdin(), OptionalActions::Now, &self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_the_first_line_of_standard_input() {
        assert_eq!(
            first_line(&b"s3cret-pass\r\nmore\n"[..]).unwrap(),
            "s3cret-pass"
        );
        assert_eq!(first_line(&b"no-newline"[..]).unwrap(), "no-newline");
        assert_eq!(first_line(&b"\n"[..]).unwrap(), "", "the policy refuses it");
        let empty = first_line(&b""[..]).unwrap_err().to_string();
        assert!(empty.contains("first line of standard input"), "{empty}");
    }
}
