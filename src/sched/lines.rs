//! A child's output read in bounded memory: lines cut at a length (one endless line never grows it), queues of a fixed size, and a tail of the last few lines.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};

use crossbeam_channel::{bounded, Receiver};

/// Reads one line into `buf`, keeping at most `max` bytes of it and discarding the rest; the
/// number of bytes read (0 at the end).
pub fn read_line_bounded(
    r: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    let mut read = 0;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(read);
        }
        let (used, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..used.min(room)]);
        r.consume(used);
        read += used;
        if done {
            return Ok(read);
        }
    }
}

/// The text of a line as read: lossy UTF-8, its line end trimmed.
fn text(buf: &[u8]) -> String {
    String::from_utf8_lossy(buf)
        .trim_end_matches(['\n', '\r'])
        .to_string()
}

/// Lines passed on together at most: a batch ends at this many lines, at [`BATCH_BYTES`], or
/// when no more output is waiting.
const BATCH_LINES: usize = 4096;
const BATCH_BYTES: usize = 64 * 1024;

/// Reads `src` on a thread of its own, line by line, each line cut at `max_line` bytes, into a
/// queue of at most `queue` batches of lines (a batch holds what was waiting, up to 4,096 lines
/// or 64 KiB, or one cut line): when the queue is full the reader waits, and so does the writer
/// at the other end of the pipe. At most about `queue` × (64 KiB + `max_line`) is held. The
/// queue disconnects at the end of `src`; the reader stops when the receiver is dropped.
pub fn spawn_line_reader<R>(src: R, max_line: usize, queue: usize) -> Receiver<Vec<String>>
where
    R: Read + Send + 'static,
{
    let (tx, rx) = bounded(queue);
    std::thread::spawn(move || {
        let mut reader = BufReader::new(src);
        let mut buf = Vec::new();
        let mut end = false;
        while !end {
            let mut batch = Vec::new();
            let mut bytes = 0;
            loop {
                buf.clear();
                match read_line_bounded(&mut reader, &mut buf, max_line) {
                    Ok(0) | Err(_) => {
                        end = true;
                        break;
                    }
                    Ok(_) => {
                        bytes += buf.len();
                        batch.push(text(&buf));
                    }
                }
                if bytes >= BATCH_BYTES || batch.len() >= BATCH_LINES || reader.buffer().is_empty()
                {
                    break;
                }
            }
            if !batch.is_empty() && tx.send(batch).is_err() {
                break;
            }
        }
    });
    rx
}

/// The last `keep` lines of a stream, each cut at `max_chars` characters.
#[derive(Debug)]
pub struct Tail {
    lines: VecDeque<String>,
    keep: usize,
    max_chars: usize,
}

impl Tail {
    pub fn new(keep: usize, max_chars: usize) -> Tail {
        Tail {
            lines: VecDeque::with_capacity(keep.min(64)),
            keep,
            max_chars,
        }
    }

    pub fn push(&mut self, line: &str) {
        if self.keep == 0 {
            return;
        }
        if self.lines.len() == self.keep {
            self.lines.pop_front();
        }
        self.lines
            .push_back(line.trim_end().chars().take(self.max_chars).collect());
    }

    /// Reads `src` to its end into the tail, each line read cut at 64 KiB; `each` sees every
    /// line as it comes.
    pub fn read_all(&mut self, src: impl Read, each: &mut dyn FnMut(&str)) {
        let mut reader = BufReader::new(src);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match read_line_bounded(&mut reader, &mut buf, 64 * 1024) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = text(&buf);
                    each(&line);
                    self.push(&line);
                }
            }
        }
    }

    pub fn lines(&self) -> impl Iterator<Item = &str> {
        self.lines.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_longer_than_the_buffer_is_read_to_its_end_and_kept_cut() {
        let mut r = BufReader::with_capacity(16, "abcdefghijklmnopqrstuvwxyz\nnext\n".as_bytes());
        let mut buf = Vec::new();
        assert_eq!(read_line_bounded(&mut r, &mut buf, 5).unwrap(), 27);
        assert_eq!(buf, b"abcde");
        buf.clear();
        assert_eq!(read_line_bounded(&mut r, &mut buf, 5).unwrap(), 5);
        assert_eq!(buf, b"next\n");
        buf.clear();
        assert_eq!(read_line_bounded(&mut r, &mut buf, 5).unwrap(), 0);
    }

    #[test]
    fn the_tail_keeps_the_last_lines_cut() {
        let mut t = Tail::new(3, 4);
        let mut seen = 0;
        t.read_all("one\ntwo\nthree33\nfour\nfive".as_bytes(), &mut |_| {
            seen += 1
        });
        assert_eq!(seen, 5);
        assert_eq!(t.lines().collect::<Vec<_>>(), ["thre", "four", "five"]);
    }

    #[test]
    fn the_reader_waits_on_a_full_queue_and_stops_when_dropped() {
        let text: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        let rx = spawn_line_reader(std::io::Cursor::new(text.into_bytes()), 100, 4);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(rx.len() <= 4, "{}", rx.len());
        let all: Vec<String> = rx.iter().flatten().collect();
        assert_eq!(all.len(), 1000);
        assert_eq!(all[999], "line 999");
        // A long line is cut, and the line after it comes whole.
        let text = format!("{}\nnext\n", "x".repeat(100_000));
        let rx = spawn_line_reader(std::io::Cursor::new(text.into_bytes()), 10, 1);
        let all: Vec<String> = rx.iter().flatten().collect();
        assert_eq!(all, ["xxxxxxxxxx", "next"]);
    }
}
