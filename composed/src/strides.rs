// The element strides of Q, K and V that stage 8's tensor maps read: any layout with D contiguous.
/// Element strides of the S, H and B dimensions of Q, K and V (D contiguous): `[s, h, b]` each. [B, H, S, D] is
/// (D, S·D, H·S·D), [B, S, H, D] is (H·D, D, S·H·D); the heads of a fused [B, S, 3, H, D] projection are
/// (3·H·D, D, S·3·H·D). Stage 8 reads any of them through its tensor maps (each stride a multiple of 16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Strides {
    pub q: [usize; 3],
    pub k: [usize; 3],
    pub v: [usize; 3],
}

impl Strides {
    /// Contiguous [B, H, S, D] tensors of shape `s`.
    pub fn contiguous(s: &fixtures::Shape) -> Strides {
        let kv = [s.d, s.sk * s.d, s.hkv * s.sk * s.d];
        Strides {
            q: [s.d, s.sq * s.d, s.h * s.sq * s.d],
            k: kv,
            v: kv,
        }
    }

    /// Contiguous [B, S, H, D] tensors of shape `s`.
    pub fn bshd(s: &fixtures::Shape) -> Strides {
        let kv = [s.hkv * s.d, s.d, s.sk * s.hkv * s.d];
        Strides {
            q: [s.h * s.d, s.d, s.sq * s.h * s.d],
            k: kv,
            v: kv,
        }
    }

    /// Elements a buffer must hold for a tensor of `[b, h, rows, d]` at element strides `[s, h, b]`: its last
    /// element's offset, plus one.
    pub fn extent([b, h, rows, d]: [usize; 4], [ss, sh, sb]: [usize; 3]) -> usize {
        (b - 1) * sb + (h - 1) * sh + (rows - 1) * ss + d
    }
}

/// One tensor's rows as stages 6 and 7 and the V transposes read them: its B·heads heads `head` elements apart (heads
/// of consecutive batches as evenly spaced as heads of one batch), each head's rows `row` elements apart, D
/// contiguous. Contiguous [B, heads, S, D] is (D, S·D); rows L0 … of a [B, heads, L, D] buffer are the same
/// strides from row L0 on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlatHeads {
    pub row: usize,
    pub head: usize,
}

impl FlatHeads {
    /// Contiguous [B, heads, `rows`, D].
    pub fn contiguous(rows: usize, d: usize) -> FlatHeads {
        FlatHeads {
            row: d,
            head: rows * d,
        }
    }
}

impl Strides {
    /// Q's, K's and V's rows as flat heads (`FlatHeads`): a tensor whose batch stride is not its heads times its
    /// head stride (B > 1) is refused, naming it — stages 6 and 7 address a head as one index, b·heads + h.
    pub fn flat_heads(&self, s: &fixtures::Shape) -> anyhow::Result<[FlatHeads; 3]> {
        let one = |name: &str, [ss, sh, sb]: [usize; 3], heads: usize| {
            anyhow::ensure!(
                s.b == 1 || sb == heads * sh,
                "{name} at strides (S, H, B) = ({ss}, {sh}, {sb}) elements: stage 7 reads the B·H heads evenly \
                 spaced (B stride = {heads} × H stride) or B = 1; other layouts take stage8"
            );
            Ok(FlatHeads { row: ss, head: sh })
        };
        Ok([
            one("q", self.q, s.h)?,
            one("k", self.k, s.hkv)?,
            one("v", self.v, s.hkv)?,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_heads_of_the_layouts_stage_7_reads_and_refuses() {
        let s = fixtures::Shape::cross(1, 4, 100, 300, 64)
            .with_kv_heads(2)
            .unwrap();
        // Contiguous: rows D apart, heads S·D apart.
        let c = Strides::contiguous(&s).flat_heads(&s).unwrap();
        assert_eq!(c[0], FlatHeads::contiguous(100, 64));
        assert_eq!(c[1], FlatHeads::contiguous(300, 64));
        // [B, S, H, D] at B = 1: rows H·D apart, heads D apart.
        let b = Strides::bshd(&s).flat_heads(&s).unwrap();
        assert_eq!(
            b[0],
            FlatHeads {
                row: 4 * 64,
                head: 64
            }
        );
        assert_eq!(
            b[2],
            FlatHeads {
                row: 2 * 64,
                head: 64
            }
        );
        // A run of rows of heads 500 rows long (the ring's halves), B = 2: heads evenly spaced across batches.
        let two = fixtures::Shape::cross(2, 4, 100, 300, 64);
        let view = [64, 500 * 64, 4 * 500 * 64];
        let v = Strides {
            q: view,
            k: view,
            v: view,
        }
        .flat_heads(&two)
        .unwrap();
        assert_eq!(
            v[1],
            FlatHeads {
                row: 64,
                head: 500 * 64
            }
        );
        // [B, S, H, D] at B = 2: a batch's heads are not where b·H + h would put them; named.
        let e = Strides::bshd(&two)
            .flat_heads(&two)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("q at strides") && e.contains("take stage8"),
            "{e}"
        );
    }
}
