//! The confirmation a destructive command asks for.

use std::io::IsTerminal;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::cli::Confirm;
use crate::error::CliError;

/// Asks `question` on stderr and reads the answer from stdin, unless `--yes` answered it already.
/// Anything but `y` or `yes` (an empty line and the end of input included) aborts with
/// [`CliError::Aborted`].
pub async fn confirm(question: &str, confirm: &Confirm) -> Result<(), CliError> {
    if confirm.yes {
        return Ok(());
    }
    let mut stderr = tokio::io::stderr();
    stderr
        .write_all(format!("{question} [y/N] ").as_bytes())
        .await?;
    stderr.flush().await?;
    let mut answer = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut answer)
        .await?;
    if !answer.ends_with('\n') || !std::io::stdin().is_terminal() {
        // No terminal echoed the answer's line end: end the prompt's line before anything else.
        stderr.write_all(b"\n").await?;
        stderr.flush().await?;
    }
    match is_yes(&answer) {
        true => Ok(()),
        false => Err(CliError::Aborted),
    }
}

/// Whether an answer agrees.
fn is_yes(answer: &str) -> bool {
    matches!(answer.trim().to_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_y_or_yes_agrees() {
        for answer in ["y\n", "Y", " yes \n", "YES\r\n"] {
            assert!(is_yes(answer), "{answer:?}");
        }
        for answer in ["", "\n", "n\n", "no", "yess", "ok"] {
            assert!(!is_yes(answer), "{answer:?}");
        }
    }
}
