//! Hostile input for core's parsers of outside input: the agent protocol's messages (both
//! directions), job specs, deadlines, prices and registry logins. Each returns a value or an
//! error that says why; none panics. Cases per property: `hostile::CASES`.

#[path = "support/hostile.rs"]
mod hostile;

use hostile::samples::{COMMANDS, HEARTBEAT, JOB, LOGS, REGISTER, REGISTERED, REPORT, RESULT};
use hostile::{assert_says_why, json_like, text_like};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use spotplane_core::JobSpec;
use spotplane_core::agent::{
    CheckpointReport, CommandResult, Heartbeat, HeartbeatResponse, LogBatch, RegisterRequest,
    RegisterResponse, RegistryCredential,
};
use spotplane_core::job::parse_deadline_in;
use spotplane_core::money::Micros;

/// Parses `text` as a `T`: a value, or an error with a message.
fn parses<T: DeserializeOwned>(what: &str, text: &str) -> Option<T> {
    match serde_json::from_str::<T>(text) {
        Ok(v) => Some(v),
        Err(e) => {
            assert_says_why(what, &e.to_string());
            None
        }
    }
}

#[test]
fn the_samples_are_valid() {
    assert!(parses::<RegisterRequest>("register", REGISTER).is_some());
    assert!(parses::<Heartbeat>("heartbeat", HEARTBEAT).is_some());
    assert!(parses::<HeartbeatResponse>("commands", COMMANDS).is_some());
    assert!(parses::<CommandResult>("result", RESULT).is_some());
    assert!(parses::<CheckpointReport>("report", REPORT).is_some());
    assert!(parses::<LogBatch>("logs", LOGS).is_some());
    assert!(parses::<RegisterResponse>("registered", REGISTERED).is_some());
    assert!(parses::<JobSpec>("job", JOB).is_some());
}

proptest! {
    #![proptest_config(hostile::config())]

    #[test]
    fn agent_messages_to_the_control_plane_parse_or_say_why(
        register in json_like(REGISTER),
        heartbeat in json_like(HEARTBEAT),
        result in json_like(RESULT),
        report in json_like(REPORT),
        logs in json_like(LOGS),
    ) {
        parses::<RegisterRequest>("register", &register);
        parses::<Heartbeat>("heartbeat", &heartbeat);
        parses::<CommandResult>("command result", &result);
        parses::<CheckpointReport>("checkpoint report", &report);
        parses::<LogBatch>("log batch", &logs);
    }

    #[test]
    fn control_plane_answers_to_the_agent_parse_or_say_why(
        commands in json_like(COMMANDS),
        registered in json_like(REGISTERED),
    ) {
        parses::<HeartbeatResponse>("heartbeat answer", &commands);
        parses::<RegisterResponse>("register answer", &registered);
    }

    #[test]
    fn job_specs_parse_and_validate_or_say_why(job in json_like(JOB)) {
        if let Some(spec) = parses::<JobSpec>("job spec", &job) {
            let now = chrono::DateTime::from_timestamp(1_767_225_600, 0).unwrap_or_default();
            for e in spec.validate(now).iter() {
                assert_says_why(&e.field, &e.message);
            }
        }
    }

    #[test]
    fn deadlines_prices_and_registry_logins_parse_or_say_why(
        span in text_like("90m"),
        usd in text_like("0.40"),
        login in text_like("robot:s3cret"),
    ) {
        if let Err(e) = parse_deadline_in(&span) {
            assert_says_why("deadline_in", &e);
        }
        if let Err(e) = Micros::parse_usd(&usd) {
            assert_says_why("usd", &e.to_string());
        }
        let _ = RegistryCredential::parse(&login);
    }
}
