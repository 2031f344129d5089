//! Every bound the API puts on its input, named.
//!
//! A request over one of these is refused with a `problem+json` that names the field and the
//! limit (`errors[].limit`, and `limit` for the first): `413` with `limit: "body_bytes"` for a
//! body too large to read, `422` for the rest. docs/api.md lists them with their values; a test
//! there checks the list against [`ALL`].

/// One named bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// The name a rejection carries, e.g. `json_depth`.
    pub name: &'static str,
    /// The largest value allowed.
    pub max: u64,
    /// What is counted.
    pub unit: &'static str,
    /// Where it applies.
    pub applies_to: &'static str,
}

/// The default of `server.max_body_bytes` (configurable from 1 KiB to 64 MiB): larger bodies get
/// `413`, without being read further.
pub const BODY_BYTES: Limit = Limit {
    name: "body_bytes",
    max: 256 * 1024,
    unit: "bytes",
    applies_to: "every request body (default; server.max_body_bytes)",
};

/// Nesting of arrays and objects in a JSON body. No request of this API nests deeper than
/// about 6; serde_json alone would stop at 128.
pub const JSON_DEPTH: Limit = Limit {
    name: "json_depth",
    max: 32,
    unit: "levels of nesting",
    applies_to: "every JSON request body",
};

/// Items on one page of a list (`?limit=`).
pub const PAGE_SIZE: Limit = Limit {
    name: "page_size",
    max: 500,
    unit: "items",
    applies_to: "`limit` of every list",
};

pub const REPLICAS: Limit = Limit {
    name: "replicas",
    max: 1024,
    unit: "replicas",
    applies_to: "job `replicas`",
};

pub const COMMAND_ARGS: Limit = Limit {
    name: "command_args",
    max: 4096,
    unit: "arguments",
    applies_to: "job `command`",
};

pub const COMMAND_BYTES: Limit = Limit {
    name: "command_bytes",
    max: 64 * 1024,
    unit: "bytes, all arguments together",
    applies_to: "job `command`",
};

pub const ENV_VARS: Limit = Limit {
    name: "env_vars",
    max: 256,
    unit: "variables",
    applies_to: "job `env`",
};

pub const ENV_VALUE_BYTES: Limit = Limit {
    name: "env_value_bytes",
    max: 32 * 1024,
    unit: "bytes",
    applies_to: "each value of job `env`",
};

pub const SECRET_REFS: Limit = Limit {
    name: "secret_refs",
    max: 64,
    unit: "secrets",
    applies_to: "job `secrets`",
};

pub const SECRET_VALUE_BYTES: Limit = Limit {
    name: "secret_value_bytes",
    max: 64 * 1024,
    unit: "bytes",
    applies_to: "team secret `value`",
};

pub const URI_CHARS: Limit = Limit {
    name: "uri_chars",
    max: 1024,
    unit: "characters",
    applies_to: "job `checkpoint.uri`",
};

pub const NAME_CHARS: Limit = Limit {
    name: "name_chars",
    max: 63,
    unit: "characters",
    applies_to: "names of jobs, teams, secrets",
};

/// GPU readings in one agent heartbeat.
pub const HEARTBEAT_GPUS: Limit = Limit {
    name: "heartbeat_gpus",
    max: 512,
    unit: "readings",
    applies_to: "agent heartbeat `gpus`",
};

/// Replica states in one agent heartbeat.
pub const HEARTBEAT_REPLICAS: Limit = Limit {
    name: "heartbeat_replicas",
    max: 512,
    unit: "replicas",
    applies_to: "agent heartbeat `replicas`",
};

/// Command results in one agent heartbeat.
pub const HEARTBEAT_RESULTS: Limit = Limit {
    name: "heartbeat_results",
    max: 256,
    unit: "results",
    applies_to: "agent heartbeat `results`",
};

/// Files in one checkpoint manifest.
pub const MANIFEST_FILES: Limit = Limit {
    name: "manifest_files",
    max: 100_000,
    unit: "files",
    applies_to: "agent checkpoint report `manifest.files`",
};

/// Chunks in one agent log batch.
pub const LOG_CHUNKS: Limit = Limit {
    name: "log_chunks",
    max: 256,
    unit: "chunks",
    applies_to: "agent log batch `chunks`",
};

/// Output bytes (decoded) in one log chunk.
pub const LOG_CHUNK_BYTES: Limit = Limit {
    name: "log_chunk_bytes",
    max: 64 * 1024,
    unit: "bytes, decoded",
    applies_to: "agent log batch `chunks[i].data`",
};

/// Every limit, for documentation and its test.
pub const ALL: &[Limit] = &[
    BODY_BYTES,
    JSON_DEPTH,
    PAGE_SIZE,
    REPLICAS,
    COMMAND_ARGS,
    COMMAND_BYTES,
    ENV_VARS,
    ENV_VALUE_BYTES,
    SECRET_REFS,
    SECRET_VALUE_BYTES,
    URI_CHARS,
    NAME_CHARS,
    HEARTBEAT_GPUS,
    HEARTBEAT_REPLICAS,
    HEARTBEAT_RESULTS,
    MANIFEST_FILES,
    LOG_CHUNKS,
    LOG_CHUNK_BYTES,
];

/// How deeply `json` nests arrays and objects, counting only brackets outside strings; stops
/// counting once past `stop` (so a hostile body costs one pass and no more).
pub fn json_depth(json: &[u8], stop: u64) -> u64 {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0u64, 0u64, false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > stop {
                    return deepest;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_depth_counts_brackets_outside_strings_only() {
        let mut names: Vec<_> = ALL.iter().map(|l| l.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
        let cases: [(&str, u64); 6] = [
            ("{}", 1),
            (r#"{"a": [1, {"b": []}]}"#, 4),
            (r#"{"a": "[[[[{{{{"}"#, 1),
            (r#"{"a": "\"[[[", "b": [[]]}"#, 3),
            ("[[[]]] [[]]", 3),
            ("", 0),
        ];
        for (json, want) in cases {
            assert_eq!(json_depth(json.as_bytes(), 100), want, "{json}");
        }
        let deep = "[".repeat(100_000);
        assert_eq!(json_depth(deep.as_bytes(), 32), 33, "stops past the bound");
    }
}
