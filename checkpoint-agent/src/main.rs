//! The `spotplane-agent` binary.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use spotplane_core::agent::PROTOCOL_VERSION;

/// The spotplane node agent.
#[derive(Debug, Parser)]
#[command(name = "spotplane-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the node's GPUs (and MIG devices) as the agent reports them, as JSON.
    Inventory,
    /// Print the agent and protocol versions.
    Version,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Inventory => {
            let gpus = spotplane_agent::inventory::gpus();
            match serde_json::to_string_pretty(&serde_json::json!({ "gpus": gpus })) {
                Ok(s) => println!("{s}"),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Command::Version => {
            println!(
                "spotplane-agent {} (protocol {PROTOCOL_VERSION})",
                env!("CARGO_PKG_VERSION")
            );
        }
    }
    ExitCode::SUCCESS
}
