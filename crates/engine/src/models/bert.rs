//! BertModel encoder (E5, BGE, MiniLM retrievers): absolute position embeddings, post-LN
//! blocks, erf-GELU. Returns token states; pooling and normalisation live in `encoder.rs`.
use crate::config::BertConfig;
use crate::layers::{LayerNorm, Linear, LoraConfig, Mode};
use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

#[derive(Debug)]
struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

#[derive(Debug)]
pub struct Bert {
    word_embeddings: Tensor,
    position_embeddings: Tensor,
    token_type_embeddings: Tensor,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    n_heads: i64,
}

impl Bert {
    pub fn new(root: &Path, cfg: &BertConfig, lora: Option<&LoraConfig>, random: bool) -> Bert {
        let init = if random { Init::Randn { mean: 0.0, stdev: crate::layers::INIT_STD } } else { Init::Const(0.0) };
        let (d, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        let e = root / "embeddings";
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let p = root / "encoder" / "layer" / i;
                let att = &p / "attention";
                let s = &att / "self";
                Layer {
                    query: Linear::new(&s, "query", (d, d), true, lora, random),
                    key: Linear::new(&s, "key", (d, d), true, lora, random),
                    value: Linear::new(&s, "value", (d, d), true, lora, random),
                    attn_out: Linear::new(&(&att / "output"), "dense", (d, d), true, lora, random),
                    attn_norm: LayerNorm::new(&(&att / "output" / "LayerNorm"), d, eps),
                    intermediate: Linear::new(
                        &(&p / "intermediate"),
                        "dense",
                        (d, cfg.intermediate_size),
                        true,
                        lora,
                        random,
                    ),
                    output: Linear::new(&(&p / "output"), "dense", (cfg.intermediate_size, d), true, lora, random),
                    output_norm: LayerNorm::new(&(&p / "output" / "LayerNorm"), d, eps),
                }
            })
            .collect();
        Bert {
            word_embeddings: (&e / "word_embeddings").var("weight", &[cfg.vocab_size, d], init),
            position_embeddings: (&e / "position_embeddings").var("weight", &[cfg.max_position_embeddings, d], init),
            token_type_embeddings: (&e / "token_type_embeddings").var("weight", &[cfg.type_vocab_size, d], init),
            embed_norm: LayerNorm::new(&(&e / "LayerNorm"), d, eps),
            layers,
            n_heads: cfg.num_heads,
        }
    }

    /// Token states [B, T, D] for right-padded `ids` [B, T] with `attention_mask` [B, T] (1 = real).
    pub fn forward(&self, ids: &Tensor, attention_mask: &Tensor, mode: Mode) -> Tensor {
        let (b, t) = ids.size2().unwrap();
        let pos = Tensor::arange(t, (Kind::Int64, ids.device()));
        let x = Tensor::embedding(&self.word_embeddings, ids, -1, false, false)
            + Tensor::embedding(&self.position_embeddings, &pos, -1, false, false)
            + self.token_type_embeddings.get(0);
        // No hidden dropout: the retriever is adapted through LoRA, whose own dropout applies.
        let mut x = self.embed_norm.forward(&x);
        // [B, 1, 1, T]: every query may attend to every real key.
        let mask = attention_mask.to_kind(Kind::Bool).view([b, 1, 1, t]);
        let hd = x.size()[2] / self.n_heads;
        for l in &self.layers {
            let heads = |y: Tensor| y.view([b, t, self.n_heads, hd]).transpose(1, 2);
            let q = heads(l.query.forward(&x, mode));
            let k = heads(l.key.forward(&x, mode));
            let v = heads(l.value.forward(&x, mode));
            let a = Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, None, false);
            let a = a.transpose(1, 2).reshape([b, t, -1]);
            x = l.attn_norm.forward(&(l.attn_out.forward(&a, mode) + &x));
            let h = l.intermediate.forward(&x, mode).gelu("none");
            x = l.output_norm.forward(&(l.output.forward(&h, mode) + &x));
        }
        x
    }
}
