#include <catch2/catch.hpp>

#include "data/brown.h"

using attnres::data::brown_to_text;

TEST_CASE("brown_to_text: the first sentence of the corpus", "[data]") {
  const char* raw =
      "\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at "
      "investigation/nn of/in Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` no/at "
      "evidence/nn ''/'' that/cs any/dti irregularities/nns took/vbd place/nn ./.\n";
  CHECK(brown_to_text(raw) ==
        "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election "
        "produced \"no evidence\" that any irregularities took place.");
}

TEST_CASE("brown_to_text: punctuation, quotes, paragraphs", "[data]") {
  const char* raw =
      "\tHe/pps said/vbd ,/, ``/`` I'm/ppss+bem here/rb ''/'' ./.\n"
      "Why/wrb (/( really/rb )/) ?/. ?/.\n"
      "\n\n"
      "\tShe/pps didn't/dod* go/vb ;/. ;/. it/pps was/bedz 1/2/cd mile/nn --/-- far/rb !/.\n"
      "\n\n\n"
      "\tHe/pps do/do n't/* know/vb 'em/ppo ,/, or/cc '/' that/dt '/' thing/nn ./.-hl\n";
  CHECK(brown_to_text(raw) ==
        "He said, \"I'm here.\" Why (really)?\n\n"
        "She didn't go; it was 1/2 mile -- far!\n\n"
        "He don't know 'em, or 'that' thing.");
}

TEST_CASE("brown_to_text: final marks move inside closing quotes", "[data]") {
  CHECK(brown_to_text("``/`` Could/md we/ppss have/hv a/at drink/nn ''/'' ?/. ?/.\nHe/pps asked/vbd ./.") ==
        "\"Could we have a drink?\" He asked.");
  CHECK(brown_to_text("``/`` Yes/rb ''/'' ,/, she/pps said/vbd ;/. ;/. ``/`` no/rb ''/'' ;/. ;/.") ==
        "\"Yes,\" she said; \"no\";");
}

TEST_CASE("brown_to_text: empty and blank input", "[data]") {
  CHECK(brown_to_text("").empty());
  CHECK(brown_to_text("\n\n \t\n").empty());
}
