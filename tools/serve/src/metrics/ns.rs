//! Namespace policies on the metrics endpoint, so that a served volume's settings change while it
//! serves: `GET /ns` answers every policy set (JSON, as `kvhoard ns show --json` prints them),
//! `PUT /ns` takes a namespace's whole policy (JSON, the same shape, its `namespace` field
//! naming it: a name may hold characters a path would need escaped), applies it to the running
//! store at once and keeps it in the volume's superblock. `kvhoard ns show|set
//! http://ADDR` use them. A change is taken only by a server started with
//! `--allow-policy-changes`, and only from this machine (a loopback peer): the endpoint is often
//! open to a metrics scraper elsewhere, and a policy decides what may be lost (`http.rs` refuses
//! the rest before reading the body).

use std::sync::Arc;

use serde_json::Value;

use crate::policy_json::{from_json, to_json};
use crate::Shared;

/// What a request to `/ns` gets: an HTTP status and a body.
pub(super) type Answer = (&'static str, &'static str, String);

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

/// `GET /ns`: every namespace policy set, as a JSON array.
pub(super) async fn list(shared: &Arc<Shared>) -> Answer {
    let store = Arc::clone(&shared.store);
    match tokio::task::spawn_blocking(move || store.policies()).await {
        Ok(policies) => {
            let list: Vec<Value> = policies.iter().map(|(ns, p)| to_json(ns, p)).collect();
            ("200 OK", JSON, Value::Array(list).to_string())
        }
        Err(e) => ("500 Internal Server Error", TEXT, format!("the policies could not be read: {e}\n")),
    }
}

/// `PUT /ns` with `body` (the endpoint took it only where the server allows policy changes, from
/// a loopback peer): the policy of the namespace `body` names replaced by the one it holds.
pub(super) async fn set(shared: &Arc<Shared>, body: &[u8]) -> Answer {
    let parsed = serde_json::from_slice::<Value>(body).map_err(|e| format!("the body is not JSON: {e}"));
    let (named, policy) = match parsed.and_then(|v| from_json(&v)) {
        Ok(p) => p,
        Err(why) => return ("400 Bad Request", TEXT, format!("{why}\n")),
    };
    let Some(name) = named else {
        return ("400 Bad Request", TEXT, "the policy names no \"namespace\"\n".into());
    };
    let name = name.as_str();
    let store = Arc::clone(&shared.store);
    let (ns, applied) = (name.to_string(), policy.clone());
    match tokio::task::spawn_blocking(move || store.set_policy(&ns, applied)).await {
        Ok(Ok(())) => {
            tracing::info!(namespace = name, "namespace policy set over the metrics endpoint");
            ("200 OK", JSON, to_json(name, &policy).to_string())
        }
        // The store refuses what it cannot take (a bad name, a lossy codec without lossy allowed):
        // the client's to fix.
        Ok(Err(e)) => ("400 Bad Request", TEXT, format!("cannot set the policy of {name:?}: {e}\n")),
        Err(e) => ("500 Internal Server Error", TEXT, format!("the policy could not be set: {e}\n")),
    }
}
