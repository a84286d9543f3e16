//! `keygate health`: asks the running server's admin listener for `/healthz`.

use anyhow::{Context, bail};

use keygate::config::Settings;

pub(super) async fn health(settings: &Settings) -> anyhow::Result<()> {
    let mut addr = settings
        .listen
        .admin
        .context("the admin listener is turned off ([listen] admin); there is nothing to ask")?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let url = format!("http://{addr}/healthz");
    match tokio::time::timeout(HEALTH_TIMEOUT, ask_healthz(addr)).await {
        Ok(Ok(status)) if status.is_success() => {
            println!("healthy");
            Ok(())
        }
        Ok(Ok(status)) => bail!("unhealthy: {url} answered {status}"),
        Ok(Err(reason)) => bail!("cannot reach {url}: {reason}"),
        Err(_) => bail!(
            "cannot reach {url}: no answer within {} s",
            HEALTH_TIMEOUT.as_secs()
        ),
    }
}

const HEALTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// One GET /healthz on a fresh connection; the error is one short reason
/// ("connection refused"), not a chain of wrapped messages.
async fn ask_healthz(addr: std::net::SocketAddr) -> Result<http::StatusCode, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| io_reason(&e))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = http::Request::get("/healthz")
        .header(http::header::HOST, addr.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    Ok(response.status())
}

/// "connection refused" rather than "Connection refused (os error 111)".
fn io_reason(error: &std::io::Error) -> String {
    let text = error.to_string();
    let reason = text
        .rfind(" (os error ")
        .map_or(text.as_str(), |end| &text[..end]);
    let mut chars = reason.chars();
    chars
        .next()
        .map(|first| first.to_lowercase().chain(chars).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_reasons_are_short_and_lower_case() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(io_reason(&refused), "connection refused");
        let os = std::io::Error::from_raw_os_error(111);
        assert!(!io_reason(&os).contains("os error"), "{}", io_reason(&os));
    }
}
