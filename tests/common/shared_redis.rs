//! Redis for tests of limits shared between replicas: the real one on
//! 127.0.0.1:6379 (`KEYGATE_TEST_REDIS_URL` to use another), and a key
//! prefix of each test's own.

use uuid::Uuid;

/// The Redis the tests use.
pub fn redis_url() -> String {
    std::env::var("KEYGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// The address of [`redis_url`], for tests that relay to it.
pub fn redis_addr() -> std::net::SocketAddr {
    redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .parse()
        .expect("KEYGATE_TEST_REDIS_URL is redis://host:port/")
}

/// A key prefix of this test's own; its keys are deleted on drop.
pub struct Prefix(pub String);

impl Prefix {
    pub fn new() -> Prefix {
        Prefix(format!("kgtest:{}:", Uuid::new_v4().simple()))
    }

    /// Every key written under the prefix.
    pub async fn keys(&self) -> Vec<String> {
        let client = redis::Client::open(redis_url()).unwrap();
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("KEYS")
            .arg(format!("{}*", self.0))
            .query_async(&mut con)
            .await
            .unwrap()
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        let pattern = format!("{}*", self.0);
        let Ok(client) = redis::Client::open(redis_url()) else {
            return;
        };
        // A plain blocking connection: drop cannot await.
        std::thread::scope(|s| {
            s.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    let Ok(mut con) = client.get_multiplexed_async_connection().await else {
                        return;
                    };
                    let keys: Vec<String> = redis::cmd("KEYS")
                        .arg(&pattern)
                        .query_async(&mut con)
                        .await
                        .unwrap_or_default();
                    if !keys.is_empty() {
                        let _: Result<(), _> =
                            redis::cmd("DEL").arg(keys).query_async(&mut con).await;
                    }
                });
            });
        });
    }
}

impl Default for Prefix {
    fn default() -> Prefix {
        Prefix::new()
    }
}
