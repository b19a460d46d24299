//! A namespace's policy as JSON: what `kvhoard ns show --json` prints, what a server's
//! `GET /ns` answers and what its `PUT /ns` takes. One definition for all three. `drift` is a
//! fraction (0.05 for 5 %), `alpha` seconds, `ttl` an object of `budget_bytes`, `groups` and
//! `window_s` (0 or absent: the default).

use std::sync::Arc;

use kvhoard_engine::{CodecSpec, NsSettings, Policy, TtlSettings};
use serde_json::{json, Value};

/// `policy` of `namespace` as JSON.
pub fn to_json(namespace: &str, policy: &Policy) -> Value {
    let s = &policy.settings;
    json!({
        "namespace": namespace,
        "codec": policy.codec.map_or_else(|| "raw".to_string(), |c| c.to_string()),
        "lossy": policy.lossy,
        "alpha": s.alpha,
        "codecs": s.codecs.as_deref().map(|c| c.iter().map(ToString::to_string).collect::<Vec<_>>().join(" ")),
        "drift": s.drift,
        "ttl": s.ttl.map(|t| json!({"budget_bytes": t.budget_bytes, "groups": t.groups, "window_s": t.window_s})),
    })
}

/// The namespace and policy `value` describes, as [`to_json`] writes them; what is wrong with it
/// otherwise, in words. A field that is missing or `null` is unset (`codec`: raw, `lossy`:
/// denied).
pub fn from_json(value: &Value) -> Result<(Option<String>, Policy), String> {
    let Some(fields) = value.as_object() else { return Err("a policy is a JSON object".into()) };
    const KNOWN: [&str; 7] = ["namespace", "codec", "lossy", "alpha", "codecs", "drift", "ttl"];
    if let Some(unknown) = fields.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("unknown field {unknown:?}; a policy has {}", KNOWN.join(", ")));
    }
    let field = |name: &str| fields.get(name).filter(|v| !v.is_null());
    let text = |name: &str| -> Result<Option<&str>, String> {
        field(name).map(|v| v.as_str().ok_or_else(|| format!("{name:?} must be a string"))).transpose()
    };
    let number = |name: &str| -> Result<Option<f64>, String> {
        field(name).map(|v| v.as_f64().ok_or_else(|| format!("{name:?} must be a number"))).transpose()
    };
    let codec = |s: &str| CodecSpec::parse(s).map_err(|e| format!("codec {s:?}: {e}"));
    let namespace = text("namespace")?.map(str::to_string);
    let spec = text("codec")?.map(codec).transpose()?.filter(|c| !c.is_raw());
    let lossy = field("lossy").map(|v| v.as_bool().ok_or("\"lossy\" must be true or false")).transpose()?;
    let codecs = match text("codecs")? {
        None => None,
        Some(list) => {
            let parsed: Vec<CodecSpec> = list.split_whitespace().map(codec).collect::<Result<_, _>>()?;
            if parsed.is_empty() {
                return Err("\"codecs\" lists no codec; list `raw` to keep blocks only as put".into());
            }
            Some(Arc::from(parsed))
        }
    };
    let ttl = match field("ttl") {
        None => None,
        Some(t) => {
            let Some(t) = t.as_object() else { return Err("\"ttl\" must be an object".into()) };
            const TTL: [&str; 3] = ["budget_bytes", "groups", "window_s"];
            if let Some(unknown) = t.keys().find(|k| !TTL.contains(&k.as_str())) {
                return Err(format!("unknown ttl field {unknown:?}; ttl has {}", TTL.join(", ")));
            }
            // A field given must be a whole number; absent (or null) is the default.
            let n = |name: &str| -> Result<Option<u64>, String> {
                match t.get(name).filter(|v| !v.is_null()) {
                    None => Ok(None),
                    Some(v) => v.as_u64().map(Some).ok_or_else(|| format!("ttl {name:?} must be a whole number")),
                }
            };
            let budget_bytes = n("budget_bytes")?.ok_or("\"ttl\" needs \"budget_bytes\", a number of bytes")?;
            let small = |name: &str| -> Result<u32, String> {
                u32::try_from(n(name)?.unwrap_or(0)).map_err(|_| format!("ttl {name:?} is too large"))
            };
            Some(TtlSettings { budget_bytes, groups: small("groups")?, window_s: small("window_s")? })
        }
    };
    let settings = NsSettings { alpha: number("alpha")?, codecs, drift: number("drift")?, ttl };
    Ok((namespace, Policy { codec: spec, lossy: lossy.unwrap_or(false), settings }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_goes_to_json_and_back() {
        let policy = Policy {
            codec: Some(CodecSpec::lossless(1)),
            lossy: true,
            settings: NsSettings {
                alpha: Some(0.02),
                codecs: Some(Arc::from(vec![CodecSpec::lossless(1), CodecSpec::quant(8, 32, 0)])),
                drift: Some(0.1),
                ttl: Some(TtlSettings { budget_bytes: 1 << 30, groups: 16, window_s: 600 }),
            },
        };
        let json = to_json("lossy", &policy);
        assert_eq!(from_json(&json).unwrap(), (Some("lossy".to_string()), policy));
        assert_eq!(from_json(&to_json("n", &Policy::default())).unwrap(), (Some("n".into()), Policy::default()));
    }

    #[test]
    fn a_bad_policy_says_what_is_wrong() {
        let err = |v: Value| from_json(&v).unwrap_err();
        assert!(err(json!([1])).contains("a JSON object"));
        assert!(err(json!({"lossi": true})).contains("unknown field \"lossi\""));
        assert!(err(json!({"lossy": "yes"})).contains("true or false"));
        assert!(err(json!({"alpha": "fast"})).contains("\"alpha\" must be a number"));
        assert!(err(json!({"codec": "zstd:9"})).contains("codec \"zstd:9\""));
        assert!(err(json!({"codecs": " "})).contains("lists no codec"));
        assert!(err(json!({"ttl": {"groups": 4}})).contains("budget_bytes"));
        assert!(err(json!({"ttl": {"budget_bytes": 1, "groups": 1u64 << 40}})).contains("too large"));
        assert!(err(json!({"ttl": 5})).contains("must be an object"));
        assert!(err(json!({"ttl": {"budget_bytes": 1, "groups": "64"}})).contains("whole number"));
        assert!(err(json!({"ttl": {"budget_bytes": 1, "groups": -1}})).contains("whole number"));
        assert!(err(json!({"ttl": {"budget_bytes": 1, "window": 600}})).contains("unknown ttl field"));
        assert!(err(json!({"ttl": {"budget_bytes": 1e9}})).contains("whole number"));
    }
}
