//! File names ↔ keys.
//!
//! A key may hold `/` (LMCache's model names do); a file name may not. So `/` is written `%2F`
//! in a file name, and a `%` that would be misread as the start of an escape (one followed by
//! `2F`, `2f` or `25`) is written `%25`. Every other character, `%` included, stands for itself,
//! so LMCache's own names (`-SEP-`, `@`, `%`, negative hex) are keys as they are.
//!
//! A name is accepted only if it is *canonical*, the name its key would be listed under
//! (`key_to_name(name_to_key(n)) == n`); `a%25` is not (its key `a%` is listed as `a%`). Names
//! that are not canonical, `.` and `..`, and names of keys whose listed name would exceed 255
//! bytes are refused with a clear errno instead of being stored under a name that could not be
//! listed back.

/// Longest file name the kernel passes (NAME_MAX).
pub const NAME_MAX: usize = 255;

fn escapes_at(rest: &str) -> bool {
    rest.starts_with("2F") || rest.starts_with("2f") || rest.starts_with("25")
}

/// The file name a key is listed under.
pub fn key_to_name(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for (i, c) in key.char_indices() {
        match c {
            '/' => out.push_str("%2F"),
            '%' if escapes_at(key.get(i + 1..).unwrap_or_default()) => out.push_str("%25"),
            c => out.push(c),
        }
    }
    out
}

/// The key a file name stands for.
pub fn name_to_key(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if c == '%' {
            let after = rest.get(1..).unwrap_or_default();
            if after.starts_with("2F") || after.starts_with("2f") {
                out.push('/');
                rest = after.get(2..).unwrap_or_default();
                continue;
            }
            if after.starts_with("25") {
                out.push('%');
                rest = after.get(2..).unwrap_or_default();
                continue;
            }
        }
        out.push(c);
        rest = rest.get(c.len_utf8()..).unwrap_or_default();
    }
    out
}

/// Why a name cannot name a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadName {
    /// Not UTF-8.
    NotUtf8,
    /// Longer than 255 bytes.
    TooLong,
    /// `.`, `..`, empty, or not canonical.
    Invalid,
}

impl BadName {
    /// The errno that reports it.
    pub fn errno(self) -> i32 {
        match self {
            BadName::NotUtf8 => libc::EILSEQ,
            BadName::TooLong => libc::ENAMETOOLONG,
            BadName::Invalid => libc::EINVAL,
        }
    }
}

/// The key of a file name, if the name may name one.
pub fn key_of(name: &std::ffi::OsStr) -> Result<String, BadName> {
    let name = name.to_str().ok_or(BadName::NotUtf8)?;
    if name.len() > NAME_MAX {
        return Err(BadName::TooLong);
    }
    if name.is_empty() || name == "." || name == ".." {
        return Err(BadName::Invalid);
    }
    let key = name_to_key(name);
    if key_to_name(&key) != name {
        return Err(BadName::Invalid);
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn lmcache_names_are_keys_as_they_are() {
        for name in [
            "vllm@meta-llama-SEP-Llama-3.1-8B@1@0@-1a2b3c4d@bfloat16.data",
            "model-SEP-x@0x00000003@7@deadbeef.data",
            "key%with%percent@-0x7f",
            "a.tmp",
        ] {
            assert_eq!(key_of(name.as_ref()).unwrap(), name);
        }
        assert_eq!(key_to_name("meta-llama/Llama-3.1-8B@1"), "meta-llama%2FLlama-3.1-8B@1");
        assert_eq!(key_of("meta-llama%2FLlama".as_ref()).unwrap(), "meta-llama/Llama");
    }

    #[test]
    fn ambiguous_names_are_refused() {
        assert_eq!(key_of("a%25".as_ref()), Err(BadName::Invalid));
        assert_eq!(key_of("..".as_ref()), Err(BadName::Invalid));
        assert_eq!(key_of("x".repeat(256).as_ref()), Err(BadName::TooLong));
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(key_of(std::ffi::OsStr::from_bytes(b"a\xffb")), Err(BadName::NotUtf8));
    }

    proptest! {
        #[test]
        fn every_key_round_trips(key in "[a-z%/2F5@-]{1,40}") {
            let name = key_to_name(&key);
            prop_assert!(!name.contains('/'));
            prop_assert_eq!(name_to_key(&name), key.clone());
            prop_assert_eq!(key_of(name.as_ref()).unwrap(), key);
        }
    }
}
