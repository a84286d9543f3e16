//! The platform's first text frame: `{"authCmd":{"cmdId":0,"token":"<JWT>"},
//! "cmds":[...]}`, or `"apiKey":"<raw key>"` in place of `"token"`. Pure: the
//! credential it carries, and what is left of the frame for the upstream.

use serde_json::{Map, Value};

use crate::auth::credential::{self, Credential};

/// What a first frame held.
#[derive(Debug, PartialEq, Eq)]
pub struct FirstFrame {
    pub credential: Credential,
    /// The frame without `authCmd`, as JSON text; `None` when nothing is left
    /// (no other member, or only empty ones), so nothing is forwarded.
    pub rest: Option<String>,
}

/// Why a first frame does not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Not a JSON object, or no `authCmd` in it: the platform closes 1008.
    MissingAuthCmd,
    /// An `authCmd` without exactly one usable `token` or `apiKey`: a bad
    /// credential, closed 1007.
    BadCredential,
}

/// Reads the credential from a first frame and strips it.
pub fn parse(text: &str) -> Result<FirstFrame, FrameError> {
    let Ok(Value::Object(mut frame)) = serde_json::from_str::<Value>(text) else {
        return Err(FrameError::MissingAuthCmd);
    };
    let Some(auth_cmd) = frame.remove("authCmd") else {
        return Err(FrameError::MissingAuthCmd);
    };
    let credential = credential_of(&auth_cmd)?;
    Ok(FirstFrame {
        credential,
        rest: rest(frame),
    })
}

/// `{"token": ...}` or `{"apiKey": ...}`, not both, each a raw value that
/// would be a valid `Bearer` or `ApiKey` header.
fn credential_of(auth_cmd: &Value) -> Result<Credential, FrameError> {
    let Value::Object(cmd) = auth_cmd else {
        return Err(FrameError::BadCredential);
    };
    let (scheme, value) = match (cmd.get("token"), cmd.get("apiKey")) {
        (Some(Value::String(token)), None) => ("Bearer", token),
        (None, Some(Value::String(key))) => ("ApiKey", key),
        _ => return Err(FrameError::BadCredential),
    };
    // The header rules apply unchanged: visible ASCII, no comma, bounded.
    credential::parse_value(format!("{scheme} {value}").as_bytes())
        .map_err(|_| FrameError::BadCredential)
}

/// The frame's other members, unless none of them carries anything.
fn rest(frame: Map<String, Value>) -> Option<String> {
    let empty = |value: &Value| match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(members) => members.is_empty(),
        _ => false,
    };
    if frame.values().all(empty) {
        return None;
    }
    Some(Value::Object(frame).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::credential::Secret;
    use serde_json::json;

    fn parsed(value: Value) -> Result<FirstFrame, FrameError> {
        parse(&value.to_string())
    }

    #[test]
    fn a_token_auth_cmd_yields_a_bearer_credential_and_the_cmds() {
        let frame = parsed(json!({
            "authCmd": {"cmdId": 0, "token": "aaa.bbb.ccc"},
            "cmds": [{"cmdId": 1, "type": "ENTITY_DATA"}]
        }))
        .unwrap();
        assert_eq!(
            frame.credential,
            Credential::Bearer(Secret::new("aaa.bbb.ccc"))
        );
        let rest: Value = serde_json::from_str(&frame.rest.unwrap()).unwrap();
        assert_eq!(rest, json!({"cmds": [{"cmdId": 1, "type": "ENTITY_DATA"}]}));
    }

    #[test]
    fn an_api_key_auth_cmd_yields_an_api_key_credential() {
        let frame = parsed(json!({"authCmd": {"cmdId": 0, "apiKey": "tb_abc-_1"}})).unwrap();
        assert_eq!(
            frame.credential,
            Credential::ApiKey(Secret::new("tb_abc-_1"))
        );
        assert_eq!(frame.rest, None);
    }

    #[test]
    fn a_frame_with_nothing_but_the_auth_cmd_leaves_nothing_to_forward() {
        for value in [
            json!({"authCmd": {"token": "t"}}),
            json!({"authCmd": {"token": "t"}, "cmds": []}),
            json!({"authCmd": {"token": "t"}, "cmds": null, "tsSubCmds": {}}),
        ] {
            assert_eq!(parsed(value.clone()).unwrap().rest, None, "{value}");
        }
        let kept = parsed(json!({"authCmd": {"token": "t"}, "cmds": [], "x": 0})).unwrap();
        assert_eq!(kept.rest.as_deref(), Some(r#"{"cmds":[],"x":0}"#));
    }

    #[test]
    fn a_frame_without_auth_cmd_is_refused_as_missing() {
        for text in [
            r#"{"cmds":[]}"#,
            "[]",
            "not json",
            "",
            r#""authCmd""#,
            r#"{"AUTHCMD":{"token":"t"}}"#,
        ] {
            assert_eq!(parse(text), Err(FrameError::MissingAuthCmd), "{text}");
        }
    }

    #[test]
    fn an_auth_cmd_without_one_usable_credential_is_a_bad_credential() {
        for value in [
            json!({"authCmd": {}}),
            json!({"authCmd": "token"}),
            json!({"authCmd": {"token": ""}}),
            json!({"authCmd": {"token": 12}}),
            json!({"authCmd": {"token": "a b"}}),
            json!({"authCmd": {"token": "a,b"}}),
            json!({"authCmd": {"apiKey": "k\u{e9}"}}),
            json!({"authCmd": {"token": "t", "apiKey": "k"}}),
            json!({"authCmd": {"token": "x".repeat(9000)}}),
        ] {
            assert_eq!(
                parsed(value.clone()).err(),
                Some(FrameError::BadCredential),
                "{value}"
            );
        }
    }

    #[test]
    fn smuggling_a_scheme_into_the_raw_value_is_refused() {
        // "Bearer x" would parse as the value "Bearer x" after the scheme:
        // the space makes it malformed, never a second credential.
        let smuggled = parsed(json!({"authCmd": {"apiKey": "Bearer x"}}));
        assert_eq!(smuggled.err(), Some(FrameError::BadCredential));
    }

    #[test]
    fn debug_of_a_first_frame_never_shows_the_secret() {
        let frame = parsed(json!({"authCmd": {"token": "very-secret"}})).unwrap();
        assert!(!format!("{frame:?}").contains("very-secret"));
    }

    /// Hostile first frames, for the property tests and `fuzz/run`.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// JSON-ish text around an `authCmd`: members, values and breakage
        /// that have confused frame parsers.
        fn frame() -> impl Strategy<Value = String> {
            let value = prop_oneof![
                any::<String>().prop_map(|s| Value::String(s).to_string()),
                Just("null".to_string()),
                Just("[]".to_string()),
                Just("{}".to_string()),
                Just(r#"{"token":"a.b.c"}"#.to_string()),
                Just(r#"{"apiKey":"tb_k"}"#.to_string()),
                Just(r#"{"token":"a","apiKey":"k"}"#.to_string()),
                Just(r#"[{"cmdId":1}]"#.to_string()),
                "-?[0-9]{1,30}(\\.[0-9]{1,5})?",
            ];
            let key = prop_oneof![
                Just("authCmd".to_string()),
                Just("cmds".to_string()),
                Just("AuthCmd".to_string()),
                Just("authCmd\\u0000".to_string()),
                "[a-zA-Z]{0,8}",
            ];
            proptest::collection::vec((key, value), 0..6).prop_map(|members| {
                let body: Vec<String> = members
                    .iter()
                    .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
                    .collect();
                format!("{{{}}}", body.join(","))
            })
        }

        proptest! {
            #[test]
            fn any_text_is_read_or_refused_and_never_forwards_the_auth_cmd(
                text in prop_oneof![frame(), any::<String>()]
            ) {
                if let Ok(parsed) = parse(&text)
                    && let Some(rest) = parsed.rest {
                        let rest: Value = serde_json::from_str(&rest).unwrap();
                        prop_assert!(rest.get("authCmd").is_none(), "{rest}");
                    }
            }

            #[test]
            fn a_token_is_taken_as_sent_and_the_cmds_kept(
                token in "[A-Za-z0-9._~+/=-]{1,200}",
                ids in proptest::collection::vec(0u32..1000, 0..8),
            ) {
                let cmds: Vec<Value> = ids.iter().map(|id| json!({"cmdId": id})).collect();
                let text = json!({"authCmd": {"cmdId": 0, "token": token}, "cmds": cmds}).to_string();
                let parsed = parse(&text).unwrap();
                prop_assert_eq!(parsed.credential, Credential::Bearer(Secret::new(token)));
                let rest = parsed.rest.map(|r| serde_json::from_str::<Value>(&r).unwrap());
                prop_assert_eq!(rest, (!ids.is_empty()).then(|| json!({"cmds": cmds})));
            }
        }
    }
}
