//! The framing of the log stream (`GET /v1/tasks/{id}/logs?framed=true`), shared by
//! the agent that writes it and the clients that read it.

/// Content type of `GET /v1/tasks/{id}/logs?framed=true` (see [`Frame`]).
pub const LOG_FRAMES_CONTENT_TYPE: &str = "application/vnd.drover.log-frames";

/// The text a reader shows for skipped files.
pub fn skipped_notice(files: u64) -> String {
    format!("[drover: skipped {files} files removed by rotation]")
}

/// Frames of the `framed` log format (`GET /v1/tasks/{id}/logs?framed=true`): one
/// byte of kind, four bytes of big-endian payload length, the payload. Kinds: `D`
/// data, `S` files skipped (payload: the count in decimal), `E` an error that ended
/// the stream (payload: the message). The plain format carries only the data, with
/// skip notices as lines of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Log bytes.
    Data(Vec<u8>),
    /// Files removed by rotation before they were read.
    Skipped(u64),
    /// The stream failed.
    Error(String),
}

impl Frame {
    /// The frame's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload): (u8, &[u8]) = match self {
            Frame::Data(d) => (b'D', d),
            Frame::Skipped(n) => return frame(b'S', n.to_string().as_bytes()),
            Frame::Error(e) => (b'E', e.as_bytes()),
        };
        frame(kind, payload)
    }
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(kind);
    // The agent sends chunks of at most 256 KiB, far below u32::MAX.
    out.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(payload);
    out
}

/// Splits a byte stream back into [`Frame`]s.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

/// A framed stream that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed log stream from the agent: {0}")]
pub struct FrameError(String);

impl FrameDecoder {
    /// Add received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, if one was received.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let kind = self.buf[0];
        let payload: Vec<u8> = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        match kind {
            b'D' => Ok(Some(Frame::Data(payload))),
            b'S' => String::from_utf8_lossy(&payload)
                .parse()
                .map(|n| Some(Frame::Skipped(n)))
                .map_err(|_| FrameError("bad skip count".into())),
            b'E' => Ok(Some(Frame::Error(
                String::from_utf8_lossy(&payload).into_owned(),
            ))),
            other => Err(FrameError(format!("unknown frame kind {other:#04x}"))),
        }
    }

    /// Bytes of an unfinished frame left over.
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_in_pieces() {
        let frames = [
            Frame::Data(b"hello\n".to_vec()),
            Frame::Skipped(3),
            Frame::Data(vec![0; 70_000]),
            Frame::Error("boom".into()),
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let mut d = FrameDecoder::default();
        let mut got = Vec::new();
        for piece in bytes.chunks(7) {
            d.push(piece);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
        assert!(!d.has_partial());
        d.push(b"X\0\0\0\0");
        assert!(d.next_frame().is_err());
    }
}
