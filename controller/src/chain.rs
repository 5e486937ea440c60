//! An error with its causes for a person to read, each cause named once.
//!
//! anyhow's `{:#}` joins every cause with `: `, but many error types of the
//! library crates already say their cause in their own message (`cannot
//! listen on ADDR: Address already in use`) and give it as their source
//! too: the cause came out twice. [`Chain`] leaves out a cause whose text
//! the message already holds.

use std::fmt;

/// `error` and its causes, joined with `: `, each cause once.
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a anyhow::Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&render(self.0.chain().map(ToString::to_string)))
    }
}

/// The messages of a chain of errors, outermost first, joined with `: `;
/// a message already contained in the text so far is left out.
fn render(messages: impl IntoIterator<Item = String>) -> String {
    let mut text = String::new();
    for message in messages {
        if message.is_empty() || text.contains(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on 127.0.0.1:1: {source}")]
    struct Listen {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_holds_is_named_once() {
        let io = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let cause = io.to_string();
        let e = anyhow::Error::new(Listen { source: io }).context("egress serve");
        let text = Chain(&e).to_string();
        assert_eq!(
            text,
            format!("egress serve: cannot listen on 127.0.0.1:1: {cause}")
        );
        assert_eq!(text.matches(&cause).count(), 1);
    }

    #[test]
    fn causes_the_message_lacks_are_all_named() {
        let e = anyhow::anyhow!("disk full")
            .context("cannot write state.json")
            .context("reconcile");
        assert_eq!(
            Chain(&e).to_string(),
            "reconcile: cannot write state.json: disk full"
        );
    }
}
