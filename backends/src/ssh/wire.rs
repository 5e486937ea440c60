//! The holder's protocol on its unix socket: one connection per request,
//! in frames of a tag byte, a big-endian `u32` length and the payload.
//!
//! ```text
//! client → holder   R request (JSON)   I input bytes   E end of input
//! holder → client   S started          O stdout bytes  X stderr bytes
//!                   D done (JSON)      F failure (JSON SshError)   P probe ok
//! ```
//!
//! Nothing ran before `S`: a client whose holder went away earlier may
//! start another and ask again. Environment values travel in `R`, on a
//! socket only the user can open (0600 in a 0700 directory, peer uid
//! checked); they are never logged.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::RemoteExec;
use crate::exec::{ExecOutcome, ExecRequest};

pub(crate) const REQUEST: u8 = b'R';
pub(crate) const INPUT: u8 = b'I';
pub(crate) const INPUT_END: u8 = b'E';
pub(crate) const STARTED: u8 = b'S';
pub(crate) const STDOUT: u8 = b'O';
pub(crate) const STDERR: u8 = b'X';
pub(crate) const DONE: u8 = b'D';
pub(crate) const FAILURE: u8 = b'F';
pub(crate) const PROBED: u8 = b'P';

/// The largest frame either side accepts.
const MAX_FRAME: usize = 4 << 20;

/// One request to the holder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Request {
    /// Trust a host seen for the first time, if this request is the one
    /// that connects.
    pub learn: bool,
    pub op: Op,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Op {
    /// Connect if needed, and say so.
    Probe,
    /// Run a command.
    Exec {
        cmd: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<String>,
        timeout_ms: u64,
        /// Whether `I`/`E` frames follow; without, the input is empty.
        stdin: bool,
        remote: RemoteExec,
    },
}

/// The server's `127.0.0.1:remote_port`, forwarded to `local` here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forward {
    pub remote_port: u16,
    pub local: SocketAddr,
}

impl Op {
    pub(crate) fn exec_request(&self) -> Option<ExecRequest> {
        match self {
            Op::Exec {
                cmd,
                env,
                cwd,
                timeout_ms,
                ..
            } => Some(ExecRequest {
                cmd: cmd.clone(),
                env: env.clone(),
                cwd: cwd.clone(),
                timeout: Duration::from_millis(*timeout_ms),
            }),
            Op::Probe => None,
        }
    }
}

/// How a command ended, as `D` carries it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Done {
    pub exit_code: i64,
    pub timed_out: bool,
}

impl From<ExecOutcome> for Done {
    fn from(o: ExecOutcome) -> Done {
        Done {
            exit_code: o.exit_code,
            timed_out: o.timed_out,
        }
    }
}

impl From<Done> for ExecOutcome {
    fn from(d: Done) -> ExecOutcome {
        ExecOutcome {
            exit_code: d.exit_code,
            timed_out: d.timed_out,
        }
    }
}

/// Writes one frame.
pub(crate) async fn write_frame(
    w: &mut (impl AsyncWrite + Unpin),
    tag: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut head = [0u8; 5];
    head[0] = tag;
    head[1..].copy_from_slice(&len.to_be_bytes());
    w.write_all(&head).await?;
    w.write_all(payload).await?;
    w.flush().await
}

/// Writes a frame of JSON.
pub(crate) async fn write_json(
    w: &mut (impl AsyncWrite + Unpin),
    tag: u8,
    value: &impl Serialize,
) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    write_frame(w, tag, &bytes).await
}

/// Reads one frame; `None` at a clean end of the stream.
pub(crate) async fn read_frame(
    r: &mut (impl AsyncRead + Unpin),
) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut len_bytes = [0u8; 4];
    len_bytes.copy_from_slice(&head[1..]);
    let len = u32::from_be_bytes(len_bytes) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some((head[0], payload)))
}

/// Parses a JSON payload.
pub(crate) fn parse<T: for<'de> Deserialize<'de>>(payload: &[u8]) -> std::io::Result<T> {
    serde_json::from_slice(payload)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_a_clean_end_is_none() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        write_frame(&mut a, STDOUT, b"hello").await.unwrap();
        write_json(
            &mut a,
            DONE,
            &Done {
                exit_code: 3,
                timed_out: false,
            },
        )
        .await
        .unwrap();
        drop(a);
        assert_eq!(
            read_frame(&mut b).await.unwrap(),
            Some((STDOUT, b"hello".to_vec()))
        );
        let (tag, payload) = read_frame(&mut b).await.unwrap().unwrap();
        assert_eq!(tag, DONE);
        assert_eq!(parse::<Done>(&payload).unwrap().exit_code, 3);
        assert_eq!(read_frame(&mut b).await.unwrap(), None);
    }

    #[tokio::test]
    async fn oversized_frames_are_refused() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&[STDOUT, 0xff, 0xff, 0xff, 0xff])
            .await
            .unwrap();
        assert!(read_frame(&mut b).await.is_err());
    }
}
