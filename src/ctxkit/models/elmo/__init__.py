"""ELMo: the character CNN under a two-layer biLSTM LM (``model``), its character ids (``chars``)
and its weights on disk: bilm-tf / AllenNLP options + hdf5, and ctxkit's LM folders (``io``).
"""

from .model import (
    ElmoConfig, ELMO_PRESETS, CharCNN, Highway, LstmCellWithProjection, lstm_step, run_lstms, ElmoBiLM,
    ElmoLanguageModel, ScalarMix, ElmoEmbeddings, elmo_embed, reverse_padded, sampled_softmax_nll,
)
from .chars import (
    BOS_TOKEN, EOS_TOKEN, MAX_CHARS, N_CHARACTERS, word_to_char_ids, batch_to_char_ids,
)
from .io import (
    config_to_options, config_from_options, read_options, write_options, bilm_tf_shapes, bilm_tf_arrays,
    bilm_state_from_arrays, load_bilm_tf, write_bilm_tf, save_elmo_lm, load_elmo_lm, load_bilm,
)

__all__ = [
    'ElmoConfig', 'ELMO_PRESETS', 'CharCNN', 'Highway', 'LstmCellWithProjection', 'lstm_step', 'run_lstms',
    'ElmoBiLM', 'ElmoLanguageModel', 'ScalarMix', 'ElmoEmbeddings', 'elmo_embed', 'reverse_padded',
    'sampled_softmax_nll', 'BOS_TOKEN', 'EOS_TOKEN', 'MAX_CHARS', 'N_CHARACTERS', 'word_to_char_ids',
    'batch_to_char_ids', 'config_to_options', 'config_from_options', 'read_options', 'write_options',
    'bilm_tf_shapes', 'bilm_tf_arrays', 'bilm_state_from_arrays', 'load_bilm_tf', 'write_bilm_tf',
    'save_elmo_lm', 'load_elmo_lm', 'load_bilm',
]
