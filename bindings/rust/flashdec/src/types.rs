//! Element types, layouts and devices.
use flashdec_sys as sys;

/// Element type of Q, K, V and outputs (`fd_dtype`). The FP8 types are
/// types of stored K/V only (a cache's dtype, decode's K/V, append's caches;
/// docs/semantics.md S1.1).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    Bf16,
    /// OCP FP8 E4M3: largest finite 448, NaN 0x7f/0xff, no infinity.
    Fp8E4m3,
    /// OCP FP8 E5M2: largest finite 57344.
    Fp8E5m2,
}

impl DType {
    pub fn raw(self) -> i32 {
        match self {
            DType::F32 => sys::FD_DTYPE_F32,
            DType::F16 => sys::FD_DTYPE_F16,
            DType::Bf16 => sys::FD_DTYPE_BF16,
            DType::Fp8E4m3 => sys::FD_DTYPE_FP8_E4M3,
            DType::Fp8E5m2 => sys::FD_DTYPE_FP8_E5M2,
        }
    }
    pub fn from_raw(raw: i32) -> Option<DType> {
        match raw {
            sys::FD_DTYPE_F32 => Some(DType::F32),
            sys::FD_DTYPE_F16 => Some(DType::F16),
            sys::FD_DTYPE_BF16 => Some(DType::Bf16),
            sys::FD_DTYPE_FP8_E4M3 => Some(DType::Fp8E4m3),
            sys::FD_DTYPE_FP8_E5M2 => Some(DType::Fp8E5m2),
            _ => None,
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::Fp8E4m3 | DType::Fp8E5m2 => 1,
        }
    }
    /// True for the stored-K/V types FP8 E4M3 and E5M2.
    pub fn is_fp8(self) -> bool {
        matches!(self, DType::Fp8E4m3 | DType::Fp8E5m2)
    }
}

/// Order of a KV block in memory (`fd_kv_layout`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// [block_size][head_dim] per block and head.
    TokenMajor,
    /// [head_dim][block_size] per block and head.
    DimMajor,
}

impl Layout {
    pub fn raw(self) -> i32 {
        match self {
            Layout::TokenMajor => sys::FD_LAYOUT_TOKEN_MAJOR,
            Layout::DimMajor => sys::FD_LAYOUT_DIM_MAJOR,
        }
    }
    pub fn from_raw(raw: i32) -> Option<Layout> {
        match raw {
            sys::FD_LAYOUT_TOKEN_MAJOR => Some(Layout::TokenMajor),
            sys::FD_LAYOUT_DIM_MAJOR => Some(Layout::DimMajor),
            _ => None,
        }
    }
}

/// Which dims of a head RoPE rotates together (`fd_rope_style`,
/// docs/semantics.md S3.1). Both use inv_freq\[i\] = rope_base^(-2i /
/// rotary_dim) and leave the dims from rotary_dim on unchanged; a
/// checkpoint's Q/K weights fix the style.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pair i is (i, i + rotary_dim/2), "rotate_half" (GPT-NeoX; Llama,
    /// Mistral, Qwen, Gemma, Phi in Hugging Face layout). The default.
    #[default]
    SplitHalf,
    /// Pair i is (2i, 2i + 1) (GPT-J, CodeGen, ChatGLM, Meta's original
    /// Llama layout).
    Interleaved,
}

impl RopeStyle {
    pub fn raw(self) -> i32 {
        match self {
            RopeStyle::SplitHalf => sys::FD_ROPE_SPLIT_HALF,
            RopeStyle::Interleaved => sys::FD_ROPE_INTERLEAVED,
        }
    }
    pub fn from_raw(raw: i32) -> Option<RopeStyle> {
        match raw {
            sys::FD_ROPE_SPLIT_HALF => Some(RopeStyle::SplitHalf),
            sys::FD_ROPE_INTERLEAVED => Some(RopeStyle::Interleaved),
            _ => None,
        }
    }
}

/// Where memory lives and work runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(i32),
}

impl Device {
    pub fn raw(self) -> sys::fd_device {
        match self {
            Device::Cpu => sys::fd_device { type_: sys::FD_DEVICE_CPU, ordinal: 0 },
            Device::Cuda(n) => sys::fd_device { type_: sys::FD_DEVICE_CUDA, ordinal: n },
        }
    }
    pub fn from_raw(d: sys::fd_device) -> Device {
        if d.type_ == sys::FD_DEVICE_CUDA {
            Device::Cuda(d.ordinal)
        } else {
            Device::Cpu
        }
    }
}

/// IEEE binary16, stored as its bits.
#[repr(transparent)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct F16(pub u16);

/// bfloat16, stored as its bits (the upper half of a binary32).
#[repr(transparent)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Round to nearest even; NaN stays NaN.
    pub fn from_f32(x: f32) -> Bf16 {
        let u = x.to_bits();
        if u & 0x7fff_ffff > 0x7f80_0000 {
            return Bf16(((u >> 16) | 0x40) as u16);
        }
        Bf16(((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16)
    }
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl F16 {
    /// Round to nearest even, with subnormals, infinities and NaN.
    pub fn from_f32(x: f32) -> F16 {
        let u = x.to_bits();
        let a = u & 0x7fff_ffff;
        let sign = ((u >> 16) & 0x8000) as u16;
        if a > 0x7f80_0000 {
            return F16(sign | 0x7e00);
        }
        if a >= 0x477f_f000 {
            return F16(sign | 0x7c00);
        }
        if a < 0x3880_0000 {
            let r = f32::from_bits(a) + 0.5;
            return F16(sign | (r.to_bits().wrapping_sub(0x3f00_0000)) as u16);
        }
        F16(sign | ((a.wrapping_add(0xc800_0fff).wrapping_add((a >> 13) & 1)) >> 13) as u16)
    }
    pub fn to_f32(self) -> f32 {
        let h = self.0 as u32;
        let sign = (h & 0x8000) << 16;
        let e = (h >> 10) & 0x1f;
        let m = h & 0x3ff;
        if e == 0 {
            let v = m as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        if e == 31 {
            return f32::from_bits(sign | 0x7f80_0000 | (m << 13));
        }
        f32::from_bits(sign | ((e + 112) << 23) | (m << 13))
    }
}

/// OCP FP8 E4M3, stored as its bits (a K/V type only: [`DType::Fp8E4m3`]).
#[repr(transparent)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Fp8E4m3(pub u8);

/// OCP FP8 E5M2, stored as its bits (a K/V type only: [`DType::Fp8E5m2`]).
#[repr(transparent)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Fp8E5m2(pub u8);

/// The value of FP8 bits with `mant` mantissa bits and exponent bias `bias`
/// (exact in f32); `ieee_top`: the top exponent holds infinity and NaN
/// (E5M2) rather than finite values and one NaN (E4M3).
fn fp8_to_f32(bits: u8, mant: u32, bias: i32, ieee_top: bool) -> f32 {
    let top = (1u32 << (7 - mant)) - 1;
    let e = (bits as u32 >> mant) & top;
    let m = bits as u32 & ((1 << mant) - 1);
    let mag = if ieee_top && e == top {
        if m == 0 { f32::INFINITY } else { f32::NAN }
    } else if !ieee_top && e == top && m == (1 << mant) - 1 {
        f32::NAN
    } else if e == 0 {
        m as f32 * 2f32.powi(1 - bias - mant as i32)
    } else {
        (1.0 + m as f32 / (1 << mant) as f32) * 2f32.powi(e as i32 - bias)
    };
    if bits & 0x80 != 0 { -mag } else { mag }
}

impl Fp8E4m3 {
    /// The value these bits stand for (before a scale); NaN for 0x7f / 0xff.
    pub fn to_f32(self) -> f32 {
        fp8_to_f32(self.0, 3, 7, false)
    }
}

impl Fp8E5m2 {
    /// The value these bits stand for (before a scale); +-inf, NaN as IEEE.
    pub fn to_f32(self) -> f32 {
        fp8_to_f32(self.0, 2, 15, true)
    }
}

/// Element types of stored K/V: every [`Element`] plus [`Fp8E4m3`] and
/// [`Fp8E5m2`]. Sealed.
pub trait KvElement: Copy + private::Sealed {
    const DTYPE: DType;
}

/// Element types FlashDec computes with (queries, outputs, inputs of
/// writes). Sealed: only f32, F16 and Bf16.
pub trait Element: KvElement {}

impl KvElement for f32 {
    const DTYPE: DType = DType::F32;
}
impl KvElement for F16 {
    const DTYPE: DType = DType::F16;
}
impl KvElement for Bf16 {
    const DTYPE: DType = DType::Bf16;
}
impl KvElement for Fp8E4m3 {
    const DTYPE: DType = DType::Fp8E4m3;
}
impl KvElement for Fp8E5m2 {
    const DTYPE: DType = DType::Fp8E5m2;
}
impl Element for f32 {}
impl Element for F16 {}
impl Element for Bf16 {}
mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::F16 {}
    impl Sealed for super::Bf16 {}
    impl Sealed for super::Fp8E4m3 {}
    impl Sealed for super::Fp8E5m2 {}
}
