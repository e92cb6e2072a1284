//! TensorBoard event files, so `tensorboard --logdir runs/` shows every metric of a run beside
//! its `metrics.jsonl`. The format TensorFlow's record writer produces: each record is its
//! length (u64 LE), the masked CRC-32C of that length, the serialized `Event` protobuf, and the
//! masked CRC-32C of the data. An `Event` here is `{wall_time, step, summary {value {tag,
//! simple_value}}}`, the file's first one `{wall_time, file_version: "brain.Event:2"}`; a
//! resumed run writes `session_log {status: START}` at its first step, on which TensorBoard drops
//! the points the interrupted run logged from that step on (`purge_orphaned_data`).
use std::io::Write;
use std::path::Path;

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bitwise: a step's few records are tiny.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xA282_EAD8)
}

// Protobuf wire format: field keys and the three value kinds these messages use.
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, data: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn event(wall_time: f64, step: Option<i64>, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut e = vec![];
    varint(&mut e, 1 << 3 | 1); // wall_time: double
    e.extend_from_slice(&wall_time.to_le_bytes());
    if let Some(s) = step {
        varint(&mut e, 2 << 3); // step: int64
        varint(&mut e, s as u64);
    }
    body(&mut e);
    e
}

pub struct EventWriter {
    file: std::fs::File,
    path: std::path::PathBuf,
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl EventWriter {
    /// A new event file in `dir`, named `events.out.tfevents.<seconds>.<nanoseconds>.<host>.<pid>`
    /// (TensorBoard reads the files whose names contain `tfevents`, in name order: a later
    /// process's file sorts after an earlier one's).
    pub fn create(dir: &Path) -> knowrl_engine::Result<EventWriter> {
        std::fs::create_dir_all(dir).map_err(|e| knowrl_engine::EngineError::io(dir, e))?;
        let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or("knowrl".into());
        let t = now();
        let nanos = ((t.fract()) * 1e9) as u64;
        let path = dir.join(format!("events.out.tfevents.{}.{nanos:09}.{host}.{}", t as u64, std::process::id()));
        let file = std::fs::File::create(&path).map_err(|e| knowrl_engine::EngineError::io(&path, e))?;
        let mut w = EventWriter { file, path };
        w.record(&event(t, None, |e| bytes_field(e, 3, b"brain.Event:2")))?;
        Ok(w)
    }

    fn record(&mut self, data: &[u8]) -> knowrl_engine::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let mut r = Vec::with_capacity(data.len() + 16);
        r.extend_from_slice(&len);
        r.extend_from_slice(&masked_crc(&len).to_le_bytes());
        r.extend_from_slice(data);
        r.extend_from_slice(&masked_crc(data).to_le_bytes());
        self.file
            .write_all(&r)
            .and_then(|_| self.file.flush())
            .map_err(|e| knowrl_engine::EngineError::io(&self.path, e))
    }

    /// Scalars of one step, each under its tag.
    pub fn scalars(&mut self, step: i64, values: &[(String, f64)]) -> knowrl_engine::Result<()> {
        let mut summary = vec![];
        for (tag, v) in values.iter().filter(|(_, v)| v.is_finite()) {
            let mut value = vec![];
            bytes_field(&mut value, 1, tag.as_bytes());
            varint(&mut value, 2 << 3 | 5); // simple_value: float
            value.extend_from_slice(&(*v as f32).to_le_bytes());
            bytes_field(&mut summary, 1, &value);
        }
        self.record(&event(now(), Some(step), |e| bytes_field(e, 5, &summary)))
    }

    /// Marks a restart at `step`: TensorBoard drops what an earlier process logged from there on.
    pub fn restart(&mut self, step: i64) -> knowrl_engine::Result<()> {
        let mut session_log = vec![];
        varint(&mut session_log, 1 << 3); // status: START = 1
        varint(&mut session_log, 1);
        self.record(&event(now(), Some(step), |e| bytes_field(e, 7, &session_log)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_and_varints_hand_checked() {
        // The CRC-32C check value (RFC 3720 B.4) and the all-zero 32-byte vector.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        let mut v = vec![];
        varint(&mut v, 300);
        assert_eq!(v, [0xAC, 0x02]);
    }
}
